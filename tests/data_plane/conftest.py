from tests.objectstores import gcs, gcs_server, s3, s3_server  # noqa: F401  (fixtures)
