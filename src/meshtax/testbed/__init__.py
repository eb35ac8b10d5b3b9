"""Side effects of measurements behind small interfaces with fakes."""
