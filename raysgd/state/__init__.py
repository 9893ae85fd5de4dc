"""State: what a run's state is and where it is kept; pure, no Ray, on neither side.

The commit (the unit of rollback) and its assembly from the ranks' parts, tensors
packed for the object store, checkpoint files, run directories, the disk
checkpointer, and directories as one picklable value. Driver and worker both use
it; it imports neither.
"""
