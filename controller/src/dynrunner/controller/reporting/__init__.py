"""What the controller tells Gitea on a job's behalf: stage lines and the one finalize path."""
