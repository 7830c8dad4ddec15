"""Fleet: offloader fleets sized by the autoscaling controller against fleets sized by hand."""
