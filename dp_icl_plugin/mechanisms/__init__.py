"""Pure numpy mechanisms: each takes arrays and an explicit ``numpy.random.Generator``, knows nothing of models.

Every mechanism's docstring states its neighbouring relation, sensitivity and the event that accounts for
it (``dp_icl_plugin.accounting.method_events``); ``dp_icl_plugin.steps`` composes them with a backend, once for
the synthesizers and the decoders.
"""
