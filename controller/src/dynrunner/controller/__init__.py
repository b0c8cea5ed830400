"""dynrunner controller: claims Gitea Actions tasks and launches one environment per job."""
