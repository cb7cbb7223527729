//! A real PostgreSQL for the tests: Debian's `postgresql` package in a throwaway cluster
//! (`initdb` into a temporary directory, trust authentication, a free loopback port), or the
//! server `DATABASE_URL` names when it is set. Each test gets a database of its own.
//!
//! A cluster outlives no test run: a watchdog process stops it and removes its directory once
//! the test process has exited, however it exited.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A PostgreSQL server the tests can create databases on.
pub struct Server {
    /// `postgres://user@host:port` (no database), with the rights to create databases.
    base_url: String,
    /// The cluster this process started, if it started one.
    cluster: Option<Cluster>,
}

/// A cluster this process started and may stop and start again.
pub struct Cluster {
    dir: PathBuf,
    port: u16,
}

impl Server {
    /// The server shared by the tests of this process: `DATABASE_URL`'s, or one cluster started
    /// on first use.
    pub fn shared() -> &'static Server {
        static SHARED: OnceLock<Server> = OnceLock::new();
        SHARED.get_or_init(|| match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => Server {
                base_url: without_database(&url),
                cluster: None,
            },
            _ => Server::start_own(),
        })
    }

    /// A cluster of its own, for tests that stop and start the database.
    pub fn start_own() -> Server {
        let cluster = Cluster::start();
        Server {
            base_url: format!("postgres://postgres@127.0.0.1:{}", cluster.port),
            cluster: Some(cluster),
        }
    }

    /// A new, empty database on this server; its URL.
    pub fn create_database(&self) -> String {
        // Unique across runs too: a `DATABASE_URL` server keeps the databases of earlier runs.
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        format!("{}/{name}", self.base_url)
    }

    /// Runs `sql` in `database` with psql; panics with psql's message when it fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let output = Command::new("psql")
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(format!("{}/{database}", self.base_url))
            .args(["-c", sql])
            .output()
            .expect("psql runs (Debian's postgresql-client)");
        assert!(
            output.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The cluster this process started; panics for a `DATABASE_URL` server.
    pub fn cluster(&self) -> &Cluster {
        self.cluster
            .as_ref()
            .expect("a cluster of this test process")
    }
}

impl Cluster {
    fn start() -> Cluster {
        let bin = server_binaries();
        let dir = std::env::temp_dir().join(format!(
            "host-test-pg-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if running_as_root() {
            // The server refuses to run as root: the directory becomes the postgres user's.
            let chown = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(chown.success(), "chown {}", dir.display());
        }
        let initdb = as_server_user(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(initdb.success(), "initdb failed");
        let cluster = Cluster {
            dir,
            port: super::free_port(),
        };
        cluster.start_server();
        cluster.watch_over(&bin);
        cluster
    }

    /// Starts the server (again), and waits until it accepts connections.
    pub fn start_server(&self) {
        // fsync off: the tests crash hosts, not machines; a stopped server keeps its data.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            self.port,
            self.dir.display()
        );
        let started = as_server_user(&server_binaries().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-l"])
            .arg(self.dir.join("log"))
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(started.success(), "pg_ctl start failed");
    }

    /// Stops the server at once, as a crash would (`-m immediate`).
    pub fn kill_server(&self) {
        let stopped = as_server_user(&server_binaries().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(stopped.success(), "pg_ctl stop failed");
    }

    /// A detached shell that waits for this test process to end, then stops the server and
    /// removes the cluster's directory.
    fn watch_over(&self, bin: &Path) {
        let pg_ctl = bin.join("pg_ctl");
        let stop = if running_as_root() {
            format!("runuser -u postgres -- {}", pg_ctl.display())
        } else {
            pg_ctl.display().to_string()
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             {stop} -D {dir}/data -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            dir = self.dir.display(),
        );
        // `setsid -f` forks the watchdog into a session of its own and returns at once.
        let started = Command::new("setsid")
            .args(["-f", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("the cluster's watchdog starts");
        assert!(started.success(), "setsid failed");
    }
}

/// The newest PostgreSQL server binaries installed (`/usr/lib/postgresql/N/bin`), or those of
/// `PG_BINDIR`.
fn server_binaries() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server is installed (Debian's postgresql package)")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("initdb under /usr/lib/postgresql/*/bin")
        .1
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.starts_with(b"0\n"))
}

/// `program`, run as the `postgres` system user when this process is root.
fn as_server_user(program: &Path) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// `url` without its path (the database) or query.
fn without_database(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |index| index + 3);
    let end = url[after_scheme..]
        .find(['/', '?'])
        .map_or(url.len(), |index| after_scheme + index);
    url[..end].to_string()
}
