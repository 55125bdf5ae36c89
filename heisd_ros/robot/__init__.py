"""Robot backends behind one interface: piper_sdk, simulated and replayed arms."""
