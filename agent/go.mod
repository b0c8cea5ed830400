module dynrunner/agent

go 1.19
