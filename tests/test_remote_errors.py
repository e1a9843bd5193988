"""The advice of a storage's refusal is the storage's own: each scheme's credentials, and a 401 (not
authenticated) told apart from a 403 (denied). Messages as pyarrow raises them (GCS statuses from google-cloud-cpp,
S3's from the AWS SDK, HDFS's from libhdfs)."""

from __future__ import annotations

import pytest

from petal.pipeline.ingest.remote import storage_error
from petal.pipeline.reliability.errors import ConfigError

GCS_403 = ("google::cloud::Status(PERMISSION_DENIED: Permanent error GetObjectMetadata: reader@p.iam.gserviceaccount"
           ".com does not have storage.objects.get access to the Google Cloud Storage object. Permission "
           "'storage.objects.get' denied on resource (or it may not exist). error_info={reason=forbidden})")
GCS_401 = ("google::cloud::Status(UNAUTHENTICATED: Permanent error GetObjectMetadata: Invalid Credentials "
           "error_info={reason=authError, domain=global})")
S3_403 = "When getting information for key 'd/a.parquet' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject " \
         "operation: No response body."
HDFS_DENIED = ("HDFS GetPathInfo failed, errno: 13 (Permission denied) "
               "org.apache.hadoop.security.AccessControlException: Permission denied: user=etl, access=EXECUTE")


@pytest.mark.parametrize(("where", "message", "said", "advice"), [
    ("cannot list gs://corpus/shards", GCS_403, "access denied", "GOOGLE_APPLICATION_CREDENTIALS"),
    ("cannot read gs://corpus/shards/a.parquet", GCS_401, "not authenticated", "gs://anonymous@"),
    ("cannot list s3://b/d", S3_403, "access denied", "AWS_ACCESS_KEY_ID"),
    ("cannot list hdfs://nn1:8020/data", HDFS_DENIED, "access denied", "HADOOP_USER_NAME"),
])
def test_a_refusal_advises_the_credentials_of_its_own_storage(where: str, message: str, said: str, advice: str):
    """Before: every refusal advised 'for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE', and a GCS 401
    said 'access denied'."""
    error = storage_error(where, OSError(message))
    assert isinstance(error, ConfigError) and error.exit_code == 78
    text = str(error)
    assert text.startswith(f"{where}: {said} ("), text
    assert advice in text, text
    assert ("AWS_" in text) == where.startswith("cannot list s3://"), text


@pytest.mark.parametrize(("where", "cause", "absent"), [
    ("cannot list s3://b/d", "AWS_SESSION_TOKEN, AWS_PROFILE) or a wrong region (AWS_REGION)", "gs://"),
    ("cannot list gs://corpus/d", "GOOGLE_APPLICATION_CREDENTIALS", "anonymous"),
    ("cannot list hdfs://nn1:8020/data", "an expired Kerberos ticket (kinit", "HADOOP_USER_NAME"),
])
def test_a_refused_request_says_its_usual_cause_in_short_clauses(where: str, cause: str, absent: str):
    """Before: 'an expired or invalid session token (GOOGLE_APPLICATION_CREDENTIALS (a service account key file) or
    the metadata server; a public bucket as gs://anonymous@BUCKET/...) is the usual cause': the whole credentials
    list nested in parentheses, and a public bucket's spelling, which an expired token has nothing to do with."""
    text = str(storage_error(where, OSError("AWS Error UNKNOWN (HTTP status 400) during HeadObject operation")))
    assert text.startswith(f"{where}: the storage refused the request ("), text
    assert "). The usual cause is " in text and cause in text, text
    assert absent not in text and "((" not in text and text.endswith("a rerun as it is fails the same way"), text
