"""Shards in object storage: ``s3://``, ``gs://``, ``hdfs://`` or any URI ``pyarrow.fs.FileSystem.from_uri`` opens.

A source URI names one object, a prefix (a "directory": every ``*.parquet`` below it, sorted) or a glob (``*`` and
``**`` as for local files: ``s3://bucket/day=*/*.parquet``).
Credentials come from each filesystem's standard chain (for S3: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance roles; ``AWS_ENDPOINT_URL`` or the URI's
``?endpoint_override=host:port&scheme=http`` for S3-compatible servers). Footers and rows are read
with ranged reads through the filesystem object, never by downloading a whole object.

Change detection without reading a whole object: its size, its modification time and a sha256 of
its Parquet footer (``remote_sha256``): a rewritten object gets a new mtime, and new content a new
footer (offsets, sizes, statistics).

NOTE: what is shown, stored in a manifest or a report, or logged is ``RemotePath.uri``: the scheme,
the authority a filesystem's paths leave out (``stored_root``: an HDFS namenode, an Azure storage
account, an object store's endpoint named by a SOURCE's ``?endpoint_override``, GCS's ``anonymous@``) and the
filesystem path only.
A URI's user info (``s3://KEY:SECRET@bucket``) and query string (``?secret_key=...``) never leave this module.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.pipeline.ingest.skipped_names import (
    hidden_below,
    hidden_hint,
    hidden_name,
    not_parquet_hint,
)
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    NoInputError,
    PetalError,
    PetalIOError,
    UsageError,
    quote_path,
)

URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
DENIED = ("ACCESS_DENIED", "PERMISSION_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "AccessDenied",
          "Forbidden", "PermissionDenied", "Permission denied", "AuthorizationPermissionMismatch",
          "AuthorizationFailure")
# a request the storage refuses as malformed: an expired or invalid session token (S3 answers a HEAD's with a bare
# 400), a request signed for another region; a retry is refused the same way
REFUSED = ("ExpiredToken", "EXPIRED_TOKEN", "InvalidToken", "AuthorizationHeaderMalformed")
# NOTE: GCS with no credentials anywhere in its chain: it said 'storage error ...; rerun when the storage recovers'
# (74) after retrying the token for 15 minutes, though a rerun fails the same way; Azure's DefaultAzureCredential
# finding none (or none it can use) said the same at once, quoting a C++ type name
NO_CREDENTIALS = ("Could not create a OAuth2 access token", "Failed to get token from")
# a request without valid credentials (HTTP 401): not authenticated, where 403 is authenticated but denied
UNAUTHENTICATED = ("UNAUTHENTICATED", "Unauthorized", "InvalidAuthenticationInfo")
# NOTE: an HTTP status counts only as a client prints one: the AWS SDK's '(HTTP status 403)', Azure's
# 'Azure Error: [ErrorCode] 403 ...', 'HTTP status code: 401', 'HTTP response code: 401'. A bare '403' anywhere in
# the message was 'access denied' (78) for a 503 from a server on port 18403, or for any error quoting a shard named
# part-00403.parquet; 'code 401' and 'status 401' were read in a key 'code 401/...' as much
HTTP_STATUS = re.compile(r"(?:\bHTTP status(?: code:)?|\bstatus code:|\bHTTP response code:|\bAzure Error: \[\w*\]) "
                         r"(\d{3})\b")
REFUSED_STATUS, UNAUTHENTICATED_STATUS, DENIED_STATUS = (400,), (401,), (403,)
# the credentials each scheme's standard chain takes, for the messages (CHAIN_ENDPOINT: where it finds the service)
CHAIN = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (a service account key file) or the metadata server; a public bucket "
          "as gs://anonymous@BUCKET/...",
    "hdfs": "a Kerberos ticket (kinit, or ?kerb_ticket=PATH) or, without Kerberos, HADOOP_USER_NAME or "
            "?user=USER",
    "abfs": "AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (a service principal) or "
            "AZURE_FEDERATED_TOKEN_FILE (workload identity), a managed identity, or `az login`",
}
# NOTE: the usual cause of a refused request (REFUSED), by scheme: the whole CHAIN nested in the message read badly,
# and GCS's named gs://anonymous@, which has nothing to do with an expired token
REFUSED_CAUSE = {
    "s3": "an expired or invalid session token (AWS_SESSION_TOKEN, AWS_PROFILE) or a wrong region (AWS_REGION)",
    "gs": "expired or invalid credentials (GOOGLE_APPLICATION_CREDENTIALS, the metadata server's)",
    "hdfs": "an expired Kerberos ticket (kinit, ?kerb_ticket=PATH)",
    "abfs": "expired or invalid credentials (AZURE_CLIENT_SECRET, AZURE_FEDERATED_TOKEN_FILE) or a wrong account or "
            "endpoint",
}
CHAIN_ENDPOINT = {
    "s3": "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, the metadata server; another endpoint only by a SOURCE's ?endpoint_override",
    "hdfs": "the namenode in the stored URI, hdfs:/// the default one: fs.defaultFS of HADOOP_CONF_DIR; Kerberos "
            "or HADOOP_USER_NAME",
    "abfs": "the account and host in the stored URI; AZURE_TENANT_ID, AZURE_CLIENT_ID, ..., a managed identity or "
            "`az login`",
}
# NOTE: what the standard chain found no credentials in, by scheme (NO_CREDENTIALS): GCS's words were given for abfs://
NO_CREDENTIALS_FIX = {
    "gs": "for GCS set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run where the metadata server "
          "provides one",
    "abfs": "set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (a service principal) or "
            "AZURE_FEDERATED_TOKEN_FILE (workload identity, a token file this process can read), run where a managed "
            "identity provides one, or after `az login` (a SOURCE's ?credential_kind=environment, workload_identity or "
            "cli takes that one only; pyarrow takes no account key from a URI)",
}
SCHEME_FAMILY = {"gcs": "gs", "viewfs": "hdfs", "abfss": "abfs"}
# NOTE: one filesystem under two schemes, stored as one: gcs://b/k and gs://b/k were two shards (the stale one could
# win a search); abfss:// is stored as abfs:// (stored_root). viewfs:// stays apart: its authority is a mount table
STORED_SCHEME = {"gcs": "gs"}
# object stores whose paths start with the bucket and whose server a SOURCE may name by its query
# (?endpoint_override=HOST:PORT&scheme=http): that endpoint is part of a stored URI (stored_root)
OBJECT_STORES = ("s3", "gs")
GCS_ANONYMOUS = "anonymous"  # gs://anonymous@bucket/...: an option of Arrow's (a public bucket), never a credential
# Arrow's HadoopFileSystem on a host without a JVM or libhdfs: the first line, then every path it tried (dlopen);
# in a process that tried once already, only the last
HDFS_RUNTIME = ("Unable to load libjvm", "Unable to load libhdfs", "Prior attempt to load libhdfs failed")
MISSING = ("NO_SUCH_BUCKET", "NoSuchBucket", "NO_SUCH_KEY", "NoSuchKey", "does not exist")


def is_uri(source: str) -> bool:
    """True for ``scheme://...`` sources other than ``file://`` (those are local paths)."""
    return bool(URI.match(source)) and not source.lower().startswith("file://")


def file_url_path(source: str) -> str:
    """A ``file://`` URL as the local path it names (``file:///data/x``, ``file://localhost/data/x``; percent-escapes
    decoded); any other source as it is. A ``file://`` URL of another host, or with a query or fragment (an unescaped
    ``?`` or ``#``), is ``NoInputError`` (66)."""
    if not source.lower().startswith("file://"):
        return source
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(source)
    if parts.netloc.lower() not in ("", "localhost"):  # NOTE: a URL's host is case-insensitive (RFC 3986)
        raise NoInputError(f"{source!r}: a file:// URL of another host ({parts.netloc!r}); give a local path")
    marks = [m for m in "?#" if m in source]
    if marks:
        # NOTE: a URL's path ends at '?' (its query) or '#' (its fragment): file:///d/my#1 named /d/my and was read
        # at exit 0; Path.as_uri() writes them %3F and %23
        escapes = " and ".join(f"{m!r} as {'%3F' if m == '?' else '%23'}" for m in marks)
        raise NoInputError(f"{source!r}: a file:// URL's path ends at {' or '.join(map(repr, marks))} (its "
                           f"{'query' if marks[0] == '?' else 'fragment'}); write {escapes}, or give the local path")
    if not parts.path:
        raise NoInputError(f"{source!r}: a file:// URL without a path")
    return unquote(parts.path)


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local path as a ``Path`` pyarrow reads as one: a relative path whose first part holds ':' (``a:b/x``) is
    made absolute.

    NOTE: pyarrow takes ``a:b/x.parquet`` for a URI of scheme ``a``: every read and write under ``--out a:b`` was
    ArrowInvalid 'Unrecognized filesystem type in URI' (exit 1, a traceback), and ``./a:b`` is the same ``Path``."""
    local = Path(path)
    if not local.is_absolute() and local.parts and ":" in local.parts[0]:
        return Path.cwd() / local
    return local


# NOTE: the CLI's words for a URL on a path argument (click adds "Invalid value for '--out': "); the API's name it
URL_ON_A_PATH = ("is a URL; this takes a local path (or a file:// URL): only a SOURCE is read from object storage "
                 "(for a local path of that name, give it whole: $PWD/...)")
URL_ON_A_MODEL = ("is a URL; this takes a local model directory (or a file:// URL) or the id of a model in the local "
                  "Hugging Face cache: petal never downloads (for a local directory of that name, give it whole: "
                  "$PWD/...)")


def _local_argument(value: str, refused: str) -> str:
    """``value`` (an argument that names something local) with a ``file://`` URL made the local path it names; another
    URL (``s3://bucket/key``), or a ``file://`` URL ``file_url_path`` refuses, is a ``UsageError`` (2) naming it as
    given, without user info or query string."""
    if value[:7].lower() == "file://":
        try:
            return file_url_path(value)
        except NoInputError as exc:  # NOTE: 66 for a SOURCE; on a path argument a usage error, as the CLI's
            raise UsageError(str(exc)) from None
    if is_uri(value):
        raise UsageError(f"{quote_path(display_uri(value))} {refused}")
    return value


def path_argument(path: str | os.PathLike[str]) -> Path:
    """A path argument of the CLI or the API, any but a SOURCE (``--out``, ``--json-report``, ``--delete``, an INDEX,
    ``calibration``, ...), as the local ``Path`` it names: a ``file://`` URL the local path (``file_url_path``),
    another URL a ``UsageError`` (only a SOURCE is read from object storage), ``a:b`` made absolute (``local_path``).

    NOTE: the one conversion of the CLI's ``PathParam`` and of every path argument of the Python API: the API took
    ``"s3://b/idx"`` and ``"file:///x"`` for relative paths and wrote ``./s3:/b/idx``, ``./file:/x``."""
    return local_path(_local_argument(os.fspath(path), URL_ON_A_PATH))


def model_argument(model: str) -> str:
    """A ``--model`` (API ``model=``) as the directory or Hugging Face id to resolve: a ``file://`` URL the local
    directory it names, another URL (``s3://``, ``https://``) a ``UsageError``; anything else (a path, an id such as
    ``sentence-transformers/all-MiniLM-L6-v2``, which holds no ``scheme://``) as it is.

    NOTE: a file:// URL was taken for a relative path ('model 'file:///m' not found: looked at /cwd/file:/m', 78)."""
    return _local_argument(model, URL_ON_A_MODEL)


def scheme_of(source: str) -> str:
    return source.split("://", 1)[0].lower()


AZURE_SCHEMES = ("abfs", "abfss")  # Arrow's AzureFileSystem: one filesystem, TLS either way (enable_tls=false: not)
AZURE_BLOB = ".blob.core.windows.net"  # Arrow's default blob_storage_authority: the account is its subdomain


def is_azure(uri: str) -> bool:
    """Whether ``uri`` is read by Arrow's ``AzureFileSystem`` (``abfs://``, ``abfss://``)."""
    return is_uri(uri) and scheme_of(uri) in AZURE_SCHEMES


def display_uri(source: str) -> str:
    """``source`` without user info or query string: safe to show and store. An Azure URI keeps what is before its
    ``@`` (a container or an account, never a credential: ``user_info``), without a password after a ``:``; a GCS
    URI its ``anonymous@`` (an option)."""
    scheme, _, rest = source.partition("://")
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    info = _authority_user(source)
    if info:
        kept = info.partition(":")[0] + "@" if is_azure(source) else info + "@" if _anonymous(source) else ""
        rest = kept + rest[len(info) + 1:]
    return f"{scheme.lower()}://{rest}"


def user_info(source: str) -> str:
    """The credentials in URI ``source``'s user info (``KEY:SECRET`` of ``s3://KEY:SECRET@bucket/key``), ``""`` when
    it has none. For Azure only a password (``abfs://ACCOUNT:PASSWORD@container/...``, which Arrow ignores).

    NOTE: Azure's user info names a container (``abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/...``) or an account
    (``abfs://ACCOUNT@container/...``): taken for credentials, it was left out of every message (a shard shown
    without its container) and every occurrence of the name in a message was masked (a container ``in``: every
    ``in``)."""
    info = _authority_user(source)
    return info.partition(":")[2] if is_azure(source) else "" if _anonymous(source) else info


def _anonymous(source: str) -> bool:
    """Whether GCS URI ``source`` reads anonymously (``gs://anonymous@bucket/...``: a public bucket)."""
    return family_of(scheme_of(source)) == "gs" and _authority_user(source) == GCS_ANONYMOUS


def family_of(scheme: str) -> str:
    """The scheme a stored URI of ``scheme`` has, without an endpoint's transport: ``gs`` for ``gcs`` and
    ``gs+http``, ``s3`` for ``S3`` and ``s3+https`` (``stored_root``)."""
    base = scheme.lower().partition("+")[0]
    return STORED_SCHEME.get(base, base)


def _authority_user(source: str) -> str:
    """The user info of URI ``source`` as written (``KEY:SECRET``, an Azure container), ``""`` when it has none.

    NOTE: an AWS secret key often holds a ``/``, which a URI must escape (``%2F``); unescaped, it ends the authority
    early (``s3://KEY:ab/cd@bucket/key``) and a URI parser takes the key for a host, the rest of the secret for a
    path. Such text counts as user info too: a first segment holding a ``:`` not followed by a port, then an ``@``."""
    rest = source.partition("://")[2].split("?", 1)[0].split("#", 1)[0]
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        return authority.rpartition("@")[0]
    _, colon, port = authority.partition(":")
    if colon and not port.isdigit() and "@" in rest:
        return rest.rpartition("@")[0]
    return ""


def _scrubbed(message: str, source: str) -> str:
    """``message`` (a URI parser's, which may quote the whole URI) without ``source``'s user info or query string."""
    message = message.replace(source, display_uri(source))
    for secret in (user_info(source), source.partition("://")[2].partition("?")[2]):
        if secret:
            message = message.replace(secret, "***")
    return message


@dataclass(frozen=True)
class RemotePath:
    """An object in a pyarrow filesystem: the filesystem (picklable), its path there, and the safe URI."""

    filesystem: Any = field(compare=False)  # pyarrow.fs.FileSystem (identity is the path, not the client)
    path: str  # as the filesystem names it ("bucket/key" for S3, "/data/x" for HDFS)
    uri: str  # stored_root + path: scheme://bucket/key, scheme://namenode/data/x; shown, stored, the shard's identity

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def open(self) -> Any:
        """A random-access file reading by ranges (``pyarrow.NativeFile``)."""
        return self.filesystem.open_input_file(self.path)


def chain_of(uri: str, table: dict[str, str] = CHAIN) -> str:
    """What the standard chain of ``uri``'s scheme (``scheme://...``) takes, from ``table`` (``CHAIN``,
    ``CHAIN_ENDPOINT``); its words for any scheme when petal has none for this one."""
    scheme = scheme_of(uri).partition("+")[0] if URI.match(uri) else ""  # s3+http://: stored_root
    return table.get(SCHEME_FAMILY.get(scheme, scheme), "the storage's standard chain")


def hdfs_runtime_missing(where: str, message: str) -> ConfigError | None:
    """78 saying what HDFS needs when ``message`` is Arrow's failure to load libhdfs or the JVM; else ``None``.

    NOTE: the message lists every path tried (~90 dlopen lines, 15-30 KB), and was printed whole, twice."""
    if not message.lstrip().startswith(HDFS_RUNTIME):
        return None
    return ConfigError(f"{where}: HDFS needs Hadoop's libhdfs and a Java runtime, which petal could not load here "
                       f"({message.strip().splitlines()[0]}): install them and set JAVA_HOME (the JVM), "
                       "HADOOP_HOME (libhdfs.so under $HADOOP_HOME/lib/native) or ARROW_LIBHDFS_DIR (its directory), "
                       "and CLASSPATH (`hadoop classpath --glob`), as pyarrow's HadoopFileSystem documents")


def storage_error(where: str, exc: BaseException) -> PetalError:
    """A filesystem error as the exit-code contract has it: denied or refused 78, missing 66, anything else 74.
    ``where`` names the object or SOURCE (``cannot list gs://b/p``): its scheme chooses the advice (``CHAIN``).

    NOTE: every 401 and 403 was 'access denied', advising S3's variables whatever the storage (gs://, hdfs://)."""
    message = str(exc)
    runtime = hdfs_runtime_missing(where, message)
    if runtime is not None:
        return runtime
    named = next((m.group(0) for m in [re.search(r"[A-Za-z][A-Za-z0-9+.-]*://\S*", where)] if m), "")
    chain = chain_of(named)
    if _says(message, REFUSED, REFUSED_STATUS):
        cause = next((c for family, c in REFUSED_CAUSE.items() if chain == CHAIN[family]),
                     "expired or invalid credentials")
        return ConfigError(f"{where}: the storage refused the request ({_short(message)}). The usual cause is {cause}. "
                           "Fix the credentials or settings: a rerun as it is fails the same way")
    if any(m in message for m in NO_CREDENTIALS):
        cause = _credentials_cause(message)
        if "credentials file" in cause:
            return ConfigError(f"{where}: the credentials cannot be used ({cause}); fix the credentials: "
                               "GOOGLE_APPLICATION_CREDENTIALS must name a service account key file (JSON) this "
                               "process can read")
        fix = next((f for family, f in NO_CREDENTIALS_FIX.items() if chain == CHAIN[family]), NO_CREDENTIALS_FIX["gs"])
        said = cause if chain == CHAIN["abfs"] else _short(message)
        return ConfigError(f"{where}: no credentials ({said}); the storage's standard chain found none it could use: "
                           f"{fix}")
    if _says(message, UNAUTHENTICATED, UNAUTHENTICATED_STATUS):
        return ConfigError(f"{where}: not authenticated ({_short(message)}): the storage took none of the "
                           f"credentials given (expired, revoked or of another account); fix the credentials: {chain}")
    if _says(message, DENIED, DENIED_STATUS) or isinstance(exc, PermissionError):
        return ConfigError(f"{where}: access denied ({_short(message)}); check the credentials the storage's "
                           f"standard chain provides, and that they may read it: {chain}")
    if any(m in message for m in MISSING) or isinstance(exc, FileNotFoundError):
        return NoInputError(f"{where} does not exist ({_short(message)})")
    return PetalIOError(f"{where}: storage error ({_short(message)}); rerun when the storage recovers")


def _says(message: str, markers: tuple[str, ...], statuses: tuple[int, ...]) -> bool:
    """``message`` holds one of ``markers`` or one of the HTTP ``statuses`` as a client prints one (``HTTP_STATUS``)."""
    return any(m in message for m in markers) or any(int(code) in statuses for code in HTTP_STATUS.findall(message))


def _credentials_cause(message: str) -> str:
    """What the client says made its credentials fail: the GCS client's first sentence of its underlying error
    (``Cannot open credentials file /k.json``), without the status's ``error_info`` (a page of build paths); the Azure
    SDK's ``Failed to get token from DefaultAzureCredential``, without the C++ exception type it quotes."""
    azure = re.search(r"Failed to get token from \w+", message)
    if azure:
        return azure.group(0)
    cause = message.partition("The underlying error message was: ")[2] or message
    return cause.split(" error_info=", 1)[0].split(". ", 1)[0].strip()[:300]


def is_storage_error(exc: BaseException) -> bool:
    """An object-storage client error (pyarrow raises them as ``OSError`` without an errno, or, for a status it
    cannot name, as a bare ``ArrowException``: the GCS client's UNKNOWN)."""
    import pyarrow as pa

    # NOTE: Azure's errors were not among them: a 503 while reading a shard was 65 'corrupt data', never retried
    return isinstance(exc, (OSError, pa.ArrowException)) and any(
        m in str(exc) for m in ("AWS Error", "GCS", "HDFS", "google::cloud::Status", "Azure Error", *NO_CREDENTIALS))


def listing_error(shown: str, exc: BaseException) -> PetalError:
    """An error listing or looking up the SOURCE ``shown`` as the exit-code contract has it (``storage_error``); a
    path its filesystem refuses to address (``ArrowInvalid``, which is a ``ValueError``) is 66.

    NOTE: the storage's own errors come as ``OSError``, but also as ``ArrowInvalid`` (GCS: a credentials file that is
    not a key, INVALID_ARGUMENT, was 66 'names no object') and as a bare ``ArrowException`` (GCS: a credentials file
    that does not exist, UNKNOWN, was 1, an internal error with a traceback)."""
    if isinstance(exc, ValueError) and not is_storage_error(exc):
        return NoInputError(f"source {shown} names no object pyarrow's filesystems can read ({_short(str(exc))})")
    return storage_error(f"cannot list {shown}", exc)


def is_denied(exc: BaseException) -> bool:
    """A storage error a retry cannot cure: access denied, a request refused (``storage_error`` says which)."""
    message = str(exc)
    return is_storage_error(exc) and (any(m in message for m in NO_CREDENTIALS) or _says(
        message, (*DENIED, *REFUSED, *UNAUTHENTICATED), (*DENIED_STATUS, *REFUSED_STATUS, *UNAUTHENTICATED_STATUS)))


def _short(message: str) -> str:
    """A client's error on one line, at most ~300 characters, without its request ID (AWS's '. (Request ID: ...)',
    Azure's '\\n\\nRequest ID: ...')."""
    message = " ".join(re.split(r"\.? \(Request ID|\s+Request ID: ", message, maxsplit=1)[0].split())
    return message if len(message) <= 300 else message[:300].rsplit(" ", 1)[0] + " ..."


def parquet_name(name: str) -> bool:
    """A file a directory or prefix SOURCE reads: ``*.parquet`` in any case (``PART-0.PARQUET`` from tools that write
    upper-case names was skipped without a word)."""
    return name.lower().endswith(".parquet")


def list_remote(source: str, empty_ok: bool = False, held: frozenset[str] = frozenset()) -> list[RemotePath]:
    """The objects a URI names: itself, or every ``*.parquet`` below it (a prefix), sorted.

    ``empty_ok`` (``--sync`` over a live version): a prefix that holds no ``*.parquet`` names none. An object store
    has no empty directories, so a prefix whose last object went is "not found"; it names none only when ``held``
    (the live version's shard URIs) has a shard under it, and stays 66 otherwise (a typo is not an emptied corpus).
    """
    import pyarrow as pa
    from pyarrow import fs

    shown = display_uri(source)
    if "/" in user_info(source):
        raise ConfigError(f"cannot open {shown}: the credentials in the URI hold a '/', which a URI must escape: "
                          "percent-encode them ('/' as %2F, '+' as %2B), or leave them out of the URI for the "
                          "storage's standard chain (for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)")
    if user_info(source) and chain_of(source) == CHAIN["hdfs"]:
        # NOTE: Arrow's HadoopFileSystem takes the user from ?user= only (HdfsOptions::FromUri) and ignores a URI's
        # user info: hdfs://alice@nn1:8020/... connected as the process's user, without a word
        raise ConfigError(f"cannot open {shown}: an hdfs:// URI's user info (USER@) is ignored by Arrow's "
                          "HadoopFileSystem; name the user as ?user=USER (or HADOOP_USER_NAME), a Kerberos ticket as "
                          "?kerb_ticket=PATH")
    if "#" in source:
        # NOTE: a URI's path ends at '#' (its fragment), as a file:// URL's: s3://b/k/h#1.parquet read the object
        # k/h at exit 0 (and a glob lost its tail)
        raise NoInputError(f"source {shown}: a URI's path ends at '#' (its fragment); write '#' in a key as %23")
    source = arrow_uri(source)  # NOTE: a stored URI of an endpoint's object, given as a SOURCE (s3+http://...)
    try:
        filesystem, path = fs.FileSystem.from_uri(uri_encoded(source))
    except Exception as exc:  # unknown scheme, a bad query parameter, a filesystem not built into pyarrow
        message = _scrubbed(str(exc), source)
        raise hdfs_runtime_missing(f"cannot open {shown}", message) or ConfigError(f"cannot open {shown}: {message}") \
            from exc
    if not path.strip("/"):  # NOTE: s3:// (s3://$BUCKET, unset) listed every bucket the credentials reach
        raise NoInputError(f"source {shown} names no bucket (nor any object): give {scheme_of(source)}://BUCKET/...")
    if _empty_component(path):  # NOTE: s3://bkt//a was 1, an internal error (ArrowInvalid) with a traceback
        raise NoInputError(f"source {shown} has an empty path component ('//'), which names no object pyarrow's "
                           "filesystems can read; write the URI without it")
    filesystem = bounded(filesystem)
    root = stored_root(source, path)
    prefix_only = names_a_prefix(source)
    if "*" in path:
        return _glob_remote(filesystem, root, path, shown, empty_ok, prefix_only, held)
    try:
        # NOTE: from_uri drops a trailing '/': s3://b/pk2/ came back as the path b/pk2, which named the object pk2
        # beside the prefix pk2/ (an object store holds both); a URI ending in '/' names the prefix only
        # NOTE: a filesystem of directories (HDFS: absolute paths) holds no object beside a directory of its name,
        # and refuses to list a file (ArrowInvalid: 'expects base_dir ... to be a directory')
        info = filesystem.get_file_info(path) if not prefix_only or path.startswith("/") else None
        if info is not None and info.type == fs.FileType.File:
            if prefix_only:
                raise NoInputError(f"source {shown} ends in '/' (a directory), but it names a file: write it "
                                   "without the trailing '/'")
            return [RemotePath(filesystem, info.path, root + info.path)]
        listed = [] if info is not None and info.type == fs.FileType.NotFound else \
            filesystem.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True))
        if not listed and (info or filesystem.get_file_info(path)).type != fs.FileType.Directory:
            if empty_ok and _held_under(root + path, held):
                return []
            what = "bucket or prefix" if prefix_only else "bucket, object or prefix"
            raise NoInputError(f"source {shown} does not exist (no such {what})")
        found = [i.path for i in listed if i.type == fs.FileType.File and parquet_name(i.path)
                 and not hidden_below(i.path[len(path.rstrip("/")):].split("/"))]
    except PetalError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise listing_error(shown, exc) from exc
    if not found and not empty_ok:
        others = [root + i.path for i in listed if i.type == fs.FileType.File and not parquet_name(i.path)
                  and not hidden_below(i.path[len(path.rstrip("/")):].split("/"))]
        hidden = [root + i.path for i in listed if i.type == fs.FileType.File and parquet_name(i.path)]
        hint = hidden_hint(sorted(hidden), "prefix SOURCE") or not_parquet_hint(sorted(others), "prefix")
        raise NoInputError(f"no *.parquet objects under {shown}" + hint)
    return _remote_paths(filesystem, root, found)


def stored_root(source: str, path: str) -> str:
    """What the URI petal shows and stores for an object puts before its path ``path`` in the filesystem
    ``from_uri(source)`` gave: the scheme (``s3://`` + ``bucket/key``: an object store's paths start with the bucket)
    or, for a filesystem whose paths are absolute (HDFS: ``/data/x``), the scheme and the authority of ``source``, its
    namenode (``hdfs://nn1:8020`` + ``/data/x``; ``hdfs://`` + ``/data/x`` for a SOURCE on the default namenode). No
    user info or query string (``display_uri``).

    NOTE: stored as ``scheme://path``, every namenode's /data/x was ``hdfs:///data/x``: a later run (``--full``) and a
    search read it from the default namenode (``fs.defaultFS``, maybe another cluster), and two namenodes' shards of
    one path were one shard (the second dropped without a word). An index an older petal wrote still holds
    ``hdfs:///...`` for them: as before, those name the default namenode (``open_stored``).

    An object store's (``OBJECT_STORES``) object of the default endpoint is ``s3://bucket/key``, ``gcs://`` stored as
    ``gs://``; of a server a SOURCE names (``?endpoint_override=HOST:PORT&scheme=http``: ``endpoint_of``) it is
    ``s3+http://HOST:PORT/bucket/key`` (the transport in the scheme, the server as the authority, the path Arrow's);
    a GCS SOURCE's ``anonymous@`` is kept (``gs://anonymous@bucket/key``).

    NOTE: stored as ``s3://bucket/key`` whatever the endpoint, two servers' objects of one bucket and key were one
    shard (an additive run replaced one's rows by the other's, a run naming both dropped one, ``--full`` read one
    from the other) and a search read every one through the standard chain (``AWS_ENDPOINT_URL``); a public
    bucket's ``gs://anonymous@...`` objects were read with credentials (none: 'unreadable')."""
    scheme = scheme_of(source)
    if scheme in AZURE_SCHEMES:
        return f"{AZURE_SCHEMES[0]}://{azure_account(source)}/"
    if not path.startswith("/"):
        scheme = STORED_SCHEME.get(scheme, scheme)
        if scheme not in OBJECT_STORES:
            return f"{scheme}://"
        user = GCS_ANONYMOUS + "@" if _anonymous(source) else ""
        endpoint = endpoint_of(source)
        if not endpoint:
            return f"{scheme}://{user}"
        transport, _, host = endpoint.partition("://")
        return f"{scheme}+{transport}://{user}{host}/"
    return f"{scheme}://{display_uri(source).partition('://')[2].split('/', 1)[0]}"


def endpoint_of(source: str) -> str:
    """The server an object-store SOURCE's query names (``?endpoint_override=HOST:PORT&scheme=http``, Arrow's
    options; ``https`` unless ``scheme`` says otherwise, or the endpoint holds its own ``http://``) as
    ``http://host:port``; ``""`` for the default endpoint, which the storage's standard chain chooses
    (``AWS_ENDPOINT_URL`` included: never part of a stored URI). Never a credential: Arrow's S3 and GCS URIs take
    none in the query."""
    from urllib.parse import parse_qsl

    options = dict(parse_qsl(source.partition("?")[2].split("#", 1)[0], keep_blank_values=True))
    endpoint = options.get("endpoint_override", "")
    if not endpoint:
        return ""
    transport = options.get("scheme", "https")
    if "://" in endpoint:  # NOTE: the AWS SDK takes the endpoint's own scheme over ?scheme=
        transport, _, endpoint = endpoint.partition("://")
    host, slash, below = endpoint.partition("/")
    # NOTE: a host is case-insensitive; a '/' after it would read as the bucket's in the stored URI
    return f"{transport.lower()}://{host.lower()}{'%2F' + below.replace('/', '%2F') if slash else ''}"


def arrow_uri(uri: str) -> str:
    """A URI in petal's endpoint form (``s3+http://HOST:PORT/bucket/key``, as ``stored_root`` stores an object of a
    server a SOURCE named) as Arrow's ``from_uri`` takes it: ``s3://bucket/key?endpoint_override=HOST:PORT&scheme=
    http``, the URI's own query after it; any other URI as it is. The key is left as written (a SOURCE's)."""
    from urllib.parse import quote, unquote

    scheme, _, rest = uri.partition("://")
    family, plus, transport = scheme.partition("+")
    if not plus:
        return uri
    authority, _, path = rest.partition("/")
    user, at, host = authority.rpartition("@")
    path, _, query = path.partition("?")
    options = f"endpoint_override={quote(unquote(host), safe=':')}&scheme={transport.lower()}"  # NOTE: [::1]:9000
    return f"{family.lower()}://{user}{at}{path}?{query + '&' if query else ''}{options}"


def split_stored(uri: str) -> tuple[str, str]:
    """A stored URI as its ``stored_root`` and the rest: ``("s3://", "bucket/key")``, ``("s3+http://h:9000/",
    "bucket/key")``, ``("gs://anonymous@", "bucket/key")``, ``("abfs://ACCOUNT.blob.core.windows.net/",
    "container/path")``, ``("hdfs://", "nn1:8020/data/x")``."""
    scheme, _, rest = uri.partition("://")
    if scheme in AZURE_SCHEMES or "+" in scheme:
        authority, _, path = rest.partition("/")
        return f"{scheme}://{authority}/", path
    if family_of(scheme) == "gs" and rest.startswith(GCS_ANONYMOUS + "@"):  # NOTE: a bucket name holds no '@'
        return f"{scheme}://{GCS_ANONYMOUS}@", rest[len(GCS_ANONYMOUS) + 1:]
    return f"{scheme}://", rest


def _bucket_place(uri: str) -> str:
    """A stored object-store URI's root and bucket (``s3+http://h:9000/bkt``): what a SOURCE must reach."""
    root, path = split_stored(uri)
    return root + path.split("/", 1)[0]


def _source_place(source: str) -> str:
    """``_bucket_place`` of the objects SOURCE ``source`` names (its root and bucket, as ``stored_root`` has them)."""
    from urllib.parse import unquote

    arrow = arrow_uri(source)
    bucket = unquote(display_uri(arrow).partition("://")[2].split("/", 1)[0].rpartition("@")[2])
    return stored_root(arrow, bucket) + bucket


def azure_account(source: str) -> str:
    """The storage account Azure URI ``source`` reaches, as the authority of the URI petal stores for its objects
    (``abfs://`` + this + ``/container/path``): ``ACCOUNT.blob.core.windows.net`` on Azure, ``ACCOUNT@HOST:PORT``
    on another endpoint (an emulator such as Azurite, ``abfs://ACCOUNT@127.0.0.1:10000/...``); ``""`` when
    ``source`` names no account (a URI an older petal stored: ``names_no_account``). Every spelling Arrow reads as
    one account (``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/path``, ``abfs://ACCOUNT@CONTAINER/path``,
    ``abfs://ACCOUNT.blob.core.windows.net/CONTAINER/path``, an account in capitals) gives one authority, and
    ``from_uri`` reads the stored URI as that account again.

    NOTE: Arrow's AzureFileSystem names an object ``container/path``, without its account: petal stored
    ``abfs://container/path``, so two accounts' objects of one path were one shard (an additive run replaced one by
    the other) and no stored URI could be opened again (no account). The account is read by Arrow itself
    (``AzureOptions::FromUri``, the query's ``blob_storage_authority`` included), whatever filesystem
    ``fs.FileSystem.from_uri`` gives. An authority of Azure's own form (``.blob.core.chinacloudapi.cn``, set by
    the query only) is stored as the account's host there, which ``from_uri`` reads as another endpoint: such an
    object is reached again only with a SOURCE of its account (``reached_by``)."""
    return _azure_account(display_uri(source).partition("://")[2].split("/", 1)[0], source.partition("?")[2])


@functools.lru_cache(maxsize=256)
def _azure_account(authority: str, query: str) -> str:
    """``azure_account`` of a URI with this authority and query string (the path never names the account).

    NOTE: cached: Arrow's parse builds a filesystem (~0.2 ms), and a run looks up every kept shard's account."""
    import pyarrow as pa
    from pyarrow import fs

    try:  # NOTE: only the authority and the query name the account; the path may hold what the parser refuses
        filesystem, _ = fs.AzureFileSystem.from_uri(uri_encoded(f"abfs://{authority}/c{'?' + query if query else ''}"))
    except (OSError, ValueError, pa.ArrowException):  # no account ("AzureOptions doesn't contain a valid account")
        return ""
    options = filesystem.__reduce__()[1][0]
    account, endpoint = options["account_name"], options["blob_storage_authority"].lower()
    if endpoint == AZURE_BLOB:  # NOTE: Azure's account names are lower case; its host is read in any case
        return account.lower() + endpoint
    host = account + endpoint if endpoint.startswith(".") else endpoint  # NOTE: a sovereign cloud's, as above
    return f"{account}@{host}"


def names_no_account(uri: str) -> bool:
    """Whether the stored Azure URI ``uri`` names no storage account: ``abfs://container/path``, as an older petal
    stored every Azure object (``azure_account``), which petal cannot open again (which account's is it?)."""
    return is_azure(uri) and not azure_account(uri)


def stored_path(uri: str, rooted: bool) -> str:
    """The filesystem path of a stored URI (``stored_root`` + path): ``bucket/key``; with ``rooted`` (the
    filesystem's paths are absolute, as HDFS's) the path after the authority (``/data/x``); for Azure the path after
    the account (``container/path``), for an endpoint's object the path after it (``split_stored``)."""
    rest = uri.partition("://")[2]
    return "/" + rest.partition("/")[2] if rooted else split_stored(uri)[1]


def older_uris(remote: RemotePath) -> tuple[str, ...]:
    """The URIs petal before ``stored_root`` stored for ``remote``, where they differ: ``hdfs:///data/x`` for
    ``hdfs://nn1:8020/data/x`` (the namenode left out, which names the default namenode); ``abfs://container/path``
    and ``abfss://container/path`` for an Azure object (the account left out: ``azure_account``); none otherwise."""
    scheme, _, rest = remote.uri.partition("://")
    if scheme in AZURE_SCHEMES:
        return tuple(f"{azure}://{remote.path}" for azure in AZURE_SCHEMES)
    if not remote.path.startswith("/") or rest.startswith("/"):
        return ()
    return (f"{scheme}://{remote.path}",)


def names_no_namenode(uri: str) -> bool:
    """Whether the stored URI ``uri`` has an empty authority before its absolute path (``hdfs:///data/x``: the
    default namenode's, or, recorded by an older petal, any namenode's: ``older_uris``)."""
    return is_uri(uri) and uri.partition("://")[2].startswith("/")


def namenode_spelling(uri: str) -> tuple[str, str, str, str] | None:
    """``(scheme, host in lower case, port or "", path)`` of a stored HDFS URI with an authority (``hdfs://NN1:8020/data
    /x``), ``None`` for any other (an object store's, ``hdfs:///...``). Two URIs with one
    scheme, host and path whose ports are equal or one missing may name one file written two ways.

    NOTE: Arrow passes a URI without a port as port 0, "the default port will be determined by the hdfs FileSystem
    impl" (HdfsOptions::FromUri): Hadoop's configuration decides (8020, another port, an HA nameservice), so petal
    cannot know whether hdfs://nn1/x and hdfs://nn1:8020/x are one file; a host is case-insensitive in DNS, but a
    nameservice id is a configuration key."""
    scheme, _, rest = uri.partition("://")
    authority, slash, path = rest.partition("/")
    if not authority or not slash or not is_uri(uri) or SCHEME_FAMILY.get(scheme.lower(), scheme.lower()) != "hdfs":
        return None
    host, colon, port = authority.rpartition("@")[2].rpartition(":") if ":" in authority else (authority, "", "")
    return scheme.lower(), host.lower(), port if colon else "", "/" + path


def object_spelling(uri: str) -> tuple[str, str, str] | None:
    """``(scheme family, endpoint or "", bucket/key)`` of a stored object-store URI (``OBJECT_STORES``:
    ``s3+http://h:9000/b/k`` is ``("s3", "http://h:9000", "b/k")``, ``gcs://b/k`` ``("gs", "", "b/k")``), ``None``
    for any other. A URI of the default endpoint (``""``: the standard chain's, ``AWS_ENDPOINT_URL`` included) may
    name the object of any endpoint written another way."""
    scheme = scheme_of(uri) if is_uri(uri) else ""
    if family_of(scheme) not in OBJECT_STORES:
        return None
    root, path = split_stored(uri)
    transport = scheme.partition("+")[2]
    host = root.partition("://")[2].rpartition("@")[2].rstrip("/")  # NOTE: the endpoint, never anonymous@
    return family_of(scheme), f"{transport}://{host}" if transport else "", path


def names_no_endpoint(uri: str) -> bool:
    """Whether the stored URI ``uri`` is an object store's of the default endpoint (``s3://b/k``, ``gs://b/k``,
    ``gcs://b/k``: the standard chain's, or, recorded by an older petal, any endpoint's: ``stored_root``)."""
    spelling = object_spelling(uri)
    return spelling is not None and not spelling[1]


def spelled_otherwise(uri: str, other: str) -> bool:
    """Whether stored URIs ``uri`` and ``other`` differ only in how their namenode is written (``namenode_spelling``:
    ``hdfs://nn1/x``, ``hdfs://NN1:8020/x``), or an object's endpoint, scheme or ``anonymous@`` (``object_spelling``:
    ``s3://b/k`` and ``s3+http://h:9000/b/k``, ``gcs://b/k`` and ``gs://b/k``, ``gs://anonymous@b/k`` and
    ``gs://b/k``), which may be one object."""
    first, second = object_spelling(uri), object_spelling(other)
    if first is not None and second is not None:
        (family, endpoint, path), (family2, endpoint2, path2) = first, second
        return uri != other and (family, path) == (family2, path2) and (endpoint == endpoint2 or not endpoint
                                                                        or not endpoint2)
    one, two = namenode_spelling(uri), namenode_spelling(other)
    if one is None or two is None or uri == other:
        return False
    return one[::3] == two[::3] and one[1] == two[1] and (one[2] == two[2] or not one[2] or not two[2])


def _empty_component(path: str) -> bool:
    """Whether ``path`` (``bucket/key``) has an empty component (``a//b``), which pyarrow's filesystems refuse
    (``ArrowInvalid: Empty path component``) though an object store may hold such a key."""
    return "//" in path.strip("/")  # NOTE: a leading '/' is a path's root (hdfs:///data is /data), not empty


def _remote_paths(filesystem: Any, root: str, found: Any) -> list[RemotePath]:
    """The objects ``found`` (their paths) as ``RemotePath``s (their URIs ``root`` + path: ``stored_root``), sorted; a
    key pyarrow cannot address is refused.

    NOTE: S3 lists a key such as ``dd//x.parquet``, but every request for it is refused (``Empty path component``):
    it failed the whole run at preflight as 'not a readable Parquet file'. It is a shard petal may not read, refused
    (65) naming it, as a file whose name is not UTF-8 is, never skipped silently."""
    bad = sorted(root + p for p in found if _empty_component(p))
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise BadInputError("; ".join(quote_path(b) for b in bad[:5]) + more + ": an object key with an empty path "
                            "component ('//'), which pyarrow's filesystems cannot read; copy it to a key without one")
    return [RemotePath(filesystem, p, root + p) for p in sorted(found)]


def names_a_prefix(source: str) -> bool:
    """Whether URI ``source``'s path ends in ``/``: it names a prefix (a "directory"), never an object of that name."""
    return source.partition("://")[2].split("?", 1)[0].split("#", 1)[0].endswith("/")


def uri_encoded(source: str) -> str:
    """``source`` with each character a URI cannot hold in its path percent-encoded (a space, a non-ASCII letter,
    ``[``, ``{``, ...; UTF-8, as ``from_uri`` decodes it): petal shows and stores an object's URI as its key reads
    (``s3://corpus/données/a b.parquet``), which ``from_uri`` refused (78 'Cannot parse URI'). ``%`` is kept, so an
    encoded URI is the same URI; ``?`` still starts the query string and ``#`` a fragment (encode them: %3F, %23)."""
    from urllib.parse import quote

    scheme, sep, rest = source.partition("://")
    path, mark, query = rest.partition("?")
    # NOTE: a scheme is case-insensitive (RFC 3986): S3://b/k was 78, "Unrecognized filesystem type in URI: s3://..."
    return scheme.lower() + sep + quote(path, safe="/:@!$&'()*+,;=%~#") + mark + query


def stored_source(uri: str) -> str:
    """A shard URI as petal stores it (the key as it reads) written as a SOURCE naming that object: its ``%``, ``?``,
    ``#`` and what a URI cannot hold percent-encoded.

    NOTE: --full listed a kept object's stored URI again as it reads: the key g/h#1.parquet named s3://b/g/h (66
    'does not exist'), q?.parquet a query string (78), p%41.parquet the key pA.parquet. A '*' in a key stays a
    wildcard (a SOURCE has no escape for it). An endpoint's object (``s3+http://HOST:PORT/bucket/key``) is written
    as Arrow's ``from_uri`` reads it: ``s3://bucket/key?endpoint_override=HOST:PORT&scheme=http`` (``arrow_uri``)."""
    from urllib.parse import quote

    root, path = split_stored(uri)
    return arrow_uri(root + quote(path, safe="/:@!$&()*+,;=~"))


def reached_by(uri: str, sources: Sequence[str]) -> str | None:
    """The first of ``sources`` (a run's SOURCES) in the bucket or namenode of ``uri`` (a shard as petal stores it,
    ``scheme://bucket/key``, ``hdfs://nn1:8020/data/x``: ``stored_root``), whose connection options reach that object
    too; ``None`` when none is. ``hdfs:///...`` (the default namenode) is reached by a SOURCE written so. An object
    store's bucket is reached by a SOURCE at the same endpoint (``endpoint_of``; none: the default one), reading as
    it (``gs://anonymous@``), in either scheme of one filesystem (``gcs://``, ``gs://``).

    NOTE: the bucket alone matched: ``--full`` naming one server's bucket re-embedded a kept object of another
    server's bucket of that name from the SOURCE's server."""
    from urllib.parse import unquote

    scheme, _, path = uri.partition("://")
    bucket = path.split("/", 1)[0]
    if scheme in AZURE_SCHEMES:  # NOTE: an account is written many ways (azure_account), abfss:// as abfs://
        return next((s for s in sources if is_azure(s) and bucket and azure_account(s) == bucket), None)
    if family_of(scheme) in OBJECT_STORES:
        place = _bucket_place(uri)
        return next((s for s in sources if is_uri(s) and family_of(scheme_of(s)) == family_of(scheme)
                     and _source_place(s) == place), None)
    for source in sources:
        if is_uri(source) and scheme_of(source) == scheme and \
                unquote(display_uri(source).partition("://")[2].split("/", 1)[0]) == bucket:
            return source
    return None


def stored_with_options(uri: str, sources: Sequence[str] = ()) -> str:
    """``uri`` (a shard as petal stores it) as a SOURCE naming that object (``stored_source``), reached as the first of
    ``sources`` in its bucket reaches its own (``reached_by``): with that SOURCE's user info and query string
    (``?endpoint_override=host:port&scheme=http``, ``region``, credentials). Without one, the storage's standard
    chain reaches it (for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).

    NOTE: petal stores an object as ``scheme://bucket/key`` only (a query string or user info may hold credentials),
    so an object opened again from that URI alone went to the storage's default endpoint: ``--full`` looked up the
    kept objects of ``s3://b/q?endpoint_override=...`` at b.s3.us-east-1.amazonaws.com (74). The result holds the
    SOURCE's secrets: it is opened, never shown or stored (``display_uri``)."""
    named = stored_source(uri)
    source = reached_by(uri, sources)
    if source is None:
        return named  # NOTE: an endpoint's object with that endpoint (stored_source), credentials from the chain
    info = "" if is_azure(uri) else user_info(source)  # NOTE: Arrow ignores an Azure password; the account is held
    query = arrow_uri(source).partition("://")[2].partition("?")[2]  # NOTE: as uri_encoded (from_uri) parses it;
    scheme, _, path = named.partition("://")  # it names the same endpoint (reached_by): the stored one is left out
    return f"{scheme}://{info + '@' if info else ''}{path.partition('?')[0]}{'?' + query if query else ''}"


def open_stored(uri: str, filesystems: dict[str, Any] | None = None, sources: Sequence[str] = ()) -> RemotePath:
    """The object a shard URI as petal stores it names (``RemotePath.uri``: ``stored_root`` + path, the key as it
    reads, no credentials or query string), read as a SOURCE of ``sources`` in its bucket (or namenode) reads its
    own, else through the storage's standard chain (``stored_with_options``; for S3: ``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ...). ``FileNotFoundError`` when no object is there now; ``OSError`` when the storage fails
    or refuses. ``filesystems`` caches one client per bucket (or namenode) and options, with whether its paths are
    absolute (an S3 client made from a URI may first ask for the bucket's region)."""
    from pyarrow import fs

    client = f"{_bucket_place(uri)}?{reached_by(uri, sources) or ''}"  # the bucket, the options' SOURCE
    cache = filesystems if filesystems is not None else {}
    if client not in cache:
        # NOTE: the stored key is as it reads: a '%', '?' or '#' in it is the key's own, never an escape or a query
        filesystem, opened = fs.FileSystem.from_uri(uri_encoded(stored_with_options(uri, sources)))
        cache[client] = (bounded(filesystem), opened.startswith("/"))  # its paths absolute (HDFS): stored_root
    filesystem, rooted = cache[client]
    path = stored_path(uri, rooted)
    if filesystem.get_file_info(path).type != fs.FileType.File:
        raise FileNotFoundError(2, "object does not exist", uri)
    return RemotePath(filesystem, path, uri)


S3_ATTEMPTS = 3  # tries of one S3 request, each given up after the SDK's 3 s without a byte (1 s to connect)
GCS_RETRY_SECONDS = 20  # how long the GCS client retries one request (a stalled try still takes its 2 minutes)


def bounded(filesystem: Any) -> Any:
    """``filesystem`` with a bounded retry of each request. ``FileSystem.from_uri`` gives an S3 filesystem the AWS
    SDK's default strategy (10 retries, backing off), so an endpoint that accepts connections but never answers cost
    ~100 s per request (a listing, a footer, each ranged read, and petal's own read retries on top) before 74. The
    same filesystem built by ``S3FileSystem`` (as a worker process or Ray actor unpickles it) makes ``S3_ATTEMPTS``
    tries: one process and its workers now wait alike, ~10 s a request.

    NOTE: a GCS filesystem retried one request for 15 minutes (the client's default), so an unreachable endpoint
    held a run (and a SIGTERM, handled when the request returns) that long before 74; it now retries for
    ``GCS_RETRY_SECONDS``, unless the URI set its own ``retry_limit_seconds``."""
    from datetime import timedelta

    from pyarrow import fs

    if isinstance(filesystem, fs.GcsFileSystem):
        rebuild, (gcs_options,) = filesystem.__reduce__()
        if gcs_options.get("retry_time_limit") is not None:
            return filesystem
        return rebuild({**gcs_options, "retry_time_limit": timedelta(seconds=GCS_RETRY_SECONDS)})
    if not isinstance(filesystem, fs.S3FileSystem):
        return filesystem
    _, (options,) = filesystem.__reduce__()  # its settings as the constructor takes them (credentials included)
    return fs.S3FileSystem(**options, retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS))


def _glob_remote(filesystem: Any, root: str, pattern: str, shown: str, empty_ok: bool,
                 prefix_only: bool = False, held: frozenset[str] = frozenset()) -> list[RemotePath]:
    """The objects ``pattern`` matches, sorted, as a local glob's files: ``*`` within one name, ``**`` any number of
    them, a wildcard never matching a name that starts with ``.`` or ``_`` unless its part does (``skipped_names``);
    ``?`` (written ``%3F``: it starts the query string) and ``[...]`` match themselves; a prefix it matches names
    every ``*.parquet`` below it, as a prefix SOURCE. Only the prefix before the first wildcard is listed.
    ``prefix_only`` (a pattern ending in ``/``, as a local glob's): only the prefixes it matches, never an object.
    ``empty_ok`` (``--sync`` over a live version): a pattern that matches nothing names none only when it matches one
    of ``held`` (the live version's shard URIs), as a prefix SOURCE; otherwise 66 (a typo is not an emptied corpus).
    A pattern that matches nothing but for hidden parts says so (``hidden_hint``)."""
    import pyarrow as pa
    from pyarrow import fs

    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if "*" in part)
    base = "/".join(parts[:fixed])
    try:
        listed = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise listing_error(shown, exc) from exc
    found = {i.path for i in listed if i.type == fs.FileType.File and _glob_names(i.path, parts, fixed, prefix_only)}
    if found:
        return _remote_paths(filesystem, root, found)
    # NOTE: an object store has no directories: a glob under a prefix whose last object went (or a typo) matches
    # nothing, and --sync took that for an emptied corpus whatever it named (every other shard removed at exit 0)
    if empty_ok and any(_glob_names(uri[len(root):], parts, fixed, prefix_only)
                        for uri in held if uri.startswith(root)):
        return []
    hidden = sorted(root + i.path for i in listed if i.type == fs.FileType.File and parquet_name(i.path)
                    and _glob_names(i.path, parts, fixed, prefix_only, skip_hidden=False))
    raise NoInputError(f"glob {shown} matches no objects" + (
        ", nor any shard of the live version (under --sync, a glob that matches nothing mirrors an emptied corpus "
        "only where the live version holds shards it matches)" if empty_ok else "") + hidden_hint(hidden, "glob"))


def _glob_names(path: str, parts: list[str], fixed: int, prefix_only: bool, skip_hidden: bool = True) -> bool:
    """Whether the object ``path`` (``bucket/key``) is one the glob ``parts`` (its first ``fixed`` without a wildcard)
    names: an object it matches (unless ``prefix_only``), or a ``*.parquet`` below a prefix it matches whose path
    there is not hidden (NOTE: a prefix the pattern matches, Spark's ``t.parquet/part-*``, names what a prefix
    SOURCE names, never nothing; and ``**`` matches no part too: ``s3://b/sub/**/`` names ``sub/`` itself).
    ``skip_hidden=False``: what it would name but for hidden parts (the error's hint)."""
    names = path.split("/")
    if names[:fixed] != parts[:fixed]:
        return False
    if not prefix_only and _glob_match(names[fixed:], parts[fixed:], skip_hidden):
        return True
    return parquet_name(names[-1]) and any(_glob_match(names[fixed:n], parts[fixed:], skip_hidden)
                                           and not (skip_hidden and hidden_below(names[n:]))
                                           for n in range(fixed, len(names)))


def _glob_match(names: list[str], patterns: list[str], skip_hidden: bool = True) -> bool:
    """Whether the path ``names`` (its parts) matches ``patterns`` part by part (``**``: zero or more parts, none
    hidden; a wildcard part matches no hidden name unless it starts with ``.`` or ``_`` itself, as a local glob's)."""
    if not patterns:
        return not names
    head, rest = patterns[0], patterns[1:]
    if head == "**":
        deeper = bool(names) and not (skip_hidden and hidden_name(names[0]))
        return _glob_match(names, rest, skip_hidden) or (deeper and _glob_match(names[1:], patterns, skip_hidden))
    if not names or ("*" in head and skip_hidden and hidden_name(names[0]) and not hidden_name(head)):
        return False
    return _name_match(names[0], head) and _glob_match(names[1:], rest, skip_hidden)


def _name_match(name: str, pattern: str) -> bool:
    """Whether one name matches one part of a URI glob: ``*`` is any run of characters, every other character itself.

    NOTE: a URI has no ``?`` or ``[...]`` wildcards (``?`` starts its query string; an object's key may hold ``[``):
    ``fnmatch`` took ``s3://b/d/x[1]*`` for ``x1*`` and ``s3://b/d/q%3F*`` (``q?*``) for any ``q`` and one more
    character, indexing other objects than the ones named."""
    regex = ".*".join(re.escape(piece) for piece in pattern.split("*"))
    return re.fullmatch(regex, name, re.DOTALL) is not None


def _held_under(uri: str, held: frozenset[str]) -> bool:
    """Whether ``uri`` (an object or a prefix) is, or holds, one of ``held``'s shard URIs."""
    prefix = uri.rstrip("/") + "/"
    return any(shard == uri or shard.startswith(prefix) for shard in held)


@dataclass(frozen=True)
class RemoteStat:
    st_size: int
    st_mtime_ns: int


def stat_remote(remote: RemotePath) -> RemoteStat:
    from pyarrow import fs

    info = remote.filesystem.get_file_info(remote.path)
    if info.type != fs.FileType.File:
        raise FileNotFoundError(2, "object does not exist", remote.uri)
    return RemoteStat(int(info.size or 0), int(info.mtime_ns or 0))


def object_change(remote: RemotePath, size: int, mtime_ns: int) -> str | None:
    """How the object now differs from the one of ``size`` bytes modified at ``mtime_ns`` (preflight's): ``"was
    removed or renamed"``, ``"changed (a new size ...)"``, or ``None``: the same object (S3 gives every write a new
    Last-Modified, so one that is the same before and after a read saw no write in between). Raises ``OSError``
    when the storage does not answer."""
    from pyarrow import fs

    info = remote.filesystem.get_file_info(remote.path)
    if info.type != fs.FileType.File:
        return "was removed or renamed"
    differ = [name for name, seen, known in (("size", int(info.size or 0), size),
                                             ("modification time", int(info.mtime_ns or 0), mtime_ns)) if seen != known]
    return f"changed (a new {' and '.join(differ)} since the run began)" if differ else None


FOOTER_TAIL = 64 * 1024  # bytes read at an object's end for its footer, as Parquet's reader reads them


def remote_sha256(remote: RemotePath, size: int, mtime_ns: int) -> str:
    """The content identity of an object: sha256 of its size, mtime and Parquet footer (ranged reads at its end)."""
    with remote.open() as fh:
        return object_sha256(size, mtime_ns, remote_footer(fh, size))


def object_sha256(size: int, mtime_ns: int, footer: bytes) -> str:
    """``remote_sha256`` of an object of ``size`` bytes modified at ``mtime_ns`` whose footer is ``footer``
    (``remote_footer``)."""
    digest = hashlib.sha256(f"remote:{size}:{mtime_ns}:".encode())
    digest.update(footer)
    return digest.hexdigest()


def remote_footer(fh: Any, size: int) -> bytes:
    """The Parquet footer (metadata, its length and the magic) of the open object ``fh`` of ``size`` bytes: one
    ranged read of its last ``FOOTER_TAIL`` bytes, a second only for a footer longer than that; the whole object
    when under 12 bytes."""
    if size < 12:
        return bytes(fh.read())
    tail_start = max(0, size - FOOTER_TAIL)
    fh.seek(tail_start)
    tail = bytes(fh.read(size - tail_start))
    (length,) = struct.unpack("<i", tail[-8:-4])
    start = max(0, size - 8 - length)
    if start >= tail_start:
        return tail[start - tail_start:]
    fh.seek(start)
    return bytes(fh.read(tail_start - start)) + tail
