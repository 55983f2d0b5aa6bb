"""A real, container-free Kubernetes control plane for the end-to-end suite (build and run)."""
