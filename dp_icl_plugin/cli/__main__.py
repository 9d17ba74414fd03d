import sys

from dp_icl_plugin.cli import main

sys.exit(main())
