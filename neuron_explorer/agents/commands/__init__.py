"""The agents' commands: `mcp` and `report` (assembled into the CLI by neuron_explorer.entry)."""
