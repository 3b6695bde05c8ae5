"""The neuron runtime: dispatch, compile cache, fallbacks, copies, syncs, memory and events."""
