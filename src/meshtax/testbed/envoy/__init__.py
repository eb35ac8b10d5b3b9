"""The Envoy proxy: bootstrap configs, filter catalogue, the managed process."""
