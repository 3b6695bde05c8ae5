import sys

from neuron_explorer.entry import main

sys.exit(main())
