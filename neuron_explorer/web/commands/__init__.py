"""The web's command: `serve` (assembled into the CLI by neuron_explorer.entry)."""
