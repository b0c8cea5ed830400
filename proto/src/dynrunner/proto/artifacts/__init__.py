"""The ArtifactStore (Filesystem, S3) and the artifact refs: shared by the executor's runtime
library (job-to-job artifacts) and the controller's cache server (the cache's archives), so the
controller image needs no executor. Stores are blocking and stream; see `base` (the seam every
driver implements) and `store` (a store opened by its driver's name)."""
