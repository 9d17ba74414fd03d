"""Private runtime helpers: the noise source of every component and the thread stepping async callers are served
with (the adapters reach them through :mod:`dp_icl_plugin.adapters`)."""
