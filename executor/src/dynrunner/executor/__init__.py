"""dynrunner executor: runs one claimed Gitea Actions job inside its environment."""
