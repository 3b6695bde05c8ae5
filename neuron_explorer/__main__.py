import sys

from neuron_explorer.cli import main

sys.exit(main())
