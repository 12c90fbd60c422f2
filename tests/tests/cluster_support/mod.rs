//! A cluster of real processes on loopback for tests: a job manager (`caudal jobmanager`)
//! and task managers (`caudal taskmanager`) logging into a temp directory, the job binaries
//! cargo builds next to `caudal`, and helpers to submit, watch and SIGKILL them. Shared by
//! the cluster tests of this crate (cluster.rs, cluster_kafka.rs, web_ui.rs).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The directory cargo puts the workspace's binaries in (the test binary is in its `deps/`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

pub fn caudal() -> PathBuf {
    let p = bin_dir().join("caudal");
    assert!(
        p.is_file(),
        "{} is missing: build it with `cargo build -p caudal-engine --bin caudal`",
        p.display()
    );
    p
}

pub fn temperature() -> PathBuf {
    let p = bin_dir().join("temperature");
    assert!(
        p.is_file(),
        "{} is missing: build it first with `cargo build -p caudal-jobs --bin temperature` \
         (`cargo test --workspace` builds it)",
        p.display()
    );
    p
}

/// A plain HTTP client that answers every status (no error for 4xx/5xx).
pub fn http_agent() -> ureq::Agent {
    agent(None)
}

/// An HTTPS client that trusts only the CA in `ca` and presents `identity` (certificate and
/// key PEM files), if given.
pub fn https_agent(identity: Option<(&Path, &Path)>, ca: &Path) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let read = |p: &Path| std::fs::read(p).unwrap();
    let roots = RootCerts::new_with_certs(&[Certificate::from_pem(&read(ca)).unwrap()]);
    let client = identity.map(|(cert, key)| {
        let chain = [Certificate::from_pem(&read(cert)).unwrap()];
        ClientCert::new_with_certs(&chain, PrivateKey::from_pem(&read(key)).unwrap())
    });
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(roots)
        .client_cert(client)
        .unversioned_rustls_crypto_provider(
            std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .build();
    agent(Some(tls))
}

/// The status of the first answer to `GET url` (a server still starting refuses the
/// connection); panics after 10 s without one.
pub fn first_status(agent: &ureq::Agent, url: &str) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = agent.get(url).call() {
            return r.status().as_u16();
        }
        assert!(Instant::now() < deadline, "{url} did not answer within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn agent(tls: Option<ureq::tls::TlsConfig>) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        config = config.tls_config(tls);
    }
    config.build().into()
}

pub use caudal_test_stack::free_port;

/// A job manager and task managers, each a process logging into the test's directory.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub http: u16,
    pub rpc: u16,
    pub jm_flags: Vec<String>,
    /// Checkpoint storage (default `<dir>/ckpt`).
    pub checkpoint_url: String,
    /// The environment of every process (e.g. the S3 settings of the checkpoint storage).
    pub env: Vec<(String, String)>,
    /// More environment of the job manager only (e.g. a crash point of its coordinator).
    pub jm_env: Vec<(String, String)>,
    pub jm: Option<Child>,
    pub tms: Vec<(String, Child)>,
    pub agent: ureq::Agent,
    /// `https` when the job manager has TLS (its REST API is HTTPS then).
    pub scheme: &'static str,
}

impl Cluster {
    pub fn start(jm_flags: &[&str]) -> Cluster {
        Cluster::start_with(jm_flags, None, &[])
    }

    /// A job manager checkpointing to `checkpoint_url` (default `<dir>/ckpt`), every process
    /// with `env`.
    /// With `CAUDAL_TLS_*` in `env`, the job manager serves HTTPS and the cluster's REST
    /// client presents that certificate.
    pub fn start_with(jm_flags: &[&str], checkpoint_url: Option<&str>, env: &[(&str, String)]) -> Cluster {
        let var =
            |name: &str| env.iter().find(|(k, v)| *k == name && !v.is_empty()).map(|(_, v)| Path::new(v));
        let (agent, scheme) = match (var("CAUDAL_TLS_CERT"), var("CAUDAL_TLS_KEY"), var("CAUDAL_TLS_CA")) {
            (Some(cert), Some(key), Some(ca)) => (https_agent(Some((cert, key)), ca), "https"),
            _ => (http_agent(), "http"),
        };
        let dir = tempfile::tempdir().unwrap();
        let checkpoint_url =
            checkpoint_url.map_or_else(|| dir.path().join("ckpt").display().to_string(), str::to_string);
        let mut c = Cluster {
            dir,
            checkpoint_url,
            env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            jm_env: Vec::new(),
            http: free_port(),
            rpc: free_port(),
            jm_flags: jm_flags.iter().map(|s| s.to_string()).collect(),
            jm: None,
            tms: Vec::new(),
            agent,
            scheme,
        };
        c.start_jobmanager();
        c
    }

    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.http)
    }

    pub fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .unwrap()
    }

    /// Every process's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                s += &format!(
                    "\n--- {} ---\n{}",
                    e.path().display(),
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                );
            }
        }
        s
    }

    pub fn start_jobmanager(&mut self) {
        let d = self.dir.path();
        let child = Command::new(caudal())
            .envs(self.env.iter().chain(&self.jm_env).map(|(k, v)| (k, v)))
            .args(["jobmanager", "--bind", &format!("127.0.0.1:{}", self.http)])
            .args(["--rpc-bind", &format!("127.0.0.1:{}", self.rpc)])
            .args(["--checkpoint-dir", &self.checkpoint_url])
            .args(["--data-dir", &d.join("jm").display().to_string()])
            .args(["--heartbeat-timeout-ms", "2000", "--restart-backoff-ms", "200"])
            .args(&self.jm_flags)
            .stdout(self.log("jobmanager"))
            .stderr(self.log("jobmanager"))
            .spawn()
            .unwrap();
        self.jm = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.get("/api/v1/cluster").is_none() {
            assert!(Instant::now() < deadline, "the job manager did not come up:{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn start_taskmanager(&mut self, name: &str, slots: u32) {
        self.start_taskmanager_with_env(name, slots, &[]);
    }

    /// A task manager whose executors inherit `env` (e.g. a crash point).
    pub fn start_taskmanager_with_env(&mut self, name: &str, slots: u32, env: &[(&str, &str)]) {
        self.start_taskmanager_at(&self.url(), name, slots, env)
    }

    /// A task manager given `jobmanager` as the job manager's URL; a variable of `env` with
    /// an empty value is removed from its environment.
    pub fn start_taskmanager_at(&mut self, jobmanager: &str, name: &str, slots: u32, env: &[(&str, &str)]) {
        self.start_taskmanager_cmd(Command::new(caudal()), jobmanager, name, slots, env)
    }

    /// A task manager (and its executors) working in a directory of its own: a relative path
    /// in a job's arguments is then each host's own, as on hosts that share no storage.
    pub fn start_taskmanager_in_own_directory(&mut self, name: &str, slots: u32) {
        let cwd = self.dir.path().join(format!("{name}-cwd"));
        std::fs::create_dir_all(&cwd).unwrap();
        let mut cmd = Command::new(caudal());
        cmd.current_dir(cwd);
        self.start_taskmanager_cmd(cmd, &self.url(), name, slots, &[])
    }

    /// A task manager (and its executors) for which `dir` is a private, empty directory: a
    /// tmpfs mounted over it in a mount namespace of its own (`unshare -m`, as root), as on a
    /// host whose disk holds a directory of the same name that no other host sees.
    pub fn start_taskmanager_with_a_private(&mut self, name: &str, slots: u32, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "sh", "-c", "mount -t tmpfs caudal-private \"$0\" && exec \"$@\""])
            .arg(dir)
            .arg(caudal());
        self.start_taskmanager_cmd(cmd, &self.url(), name, slots, &[])
    }

    fn start_taskmanager_cmd(
        &mut self,
        mut cmd: Command,
        jobmanager: &str,
        name: &str,
        slots: u32,
        env: &[(&str, &str)],
    ) {
        for (k, v) in self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(env.iter().copied()) {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let child = cmd
            .args(["taskmanager", "--jobmanager", jobmanager, "--slots", &slots.to_string(), "--name", name])
            .args(["--data-dir", &self.dir.path().join(name).display().to_string()])
            .args(["--heartbeat-timeout-ms", "2000"])
            .stdout(self.log(name))
            .stderr(self.log(name))
            .spawn()
            .unwrap();
        self.tms.push((name.to_string(), child));
    }

    pub fn wait_for_task_managers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let info = self.get("/api/v1/cluster");
            if info.as_ref().is_some_and(|i| i["task_managers"].as_array().unwrap().len() == n) {
                return;
            }
            assert!(Instant::now() < deadline, "{n} task managers did not register: {info:?}{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        let mut r = self.agent.get(format!("{}{path}", self.url())).call().ok()?;
        if r.status() != 200 {
            return None;
        }
        r.body_mut().read_json().ok()
    }

    /// Status and JSON body of `GET path` (errors too).
    pub fn get_any(&self, path: &str) -> (u16, Value) {
        let mut r = self.agent.get(format!("{}{path}", self.url())).call().unwrap();
        (r.status().as_u16(), r.body_mut().read_json().unwrap_or(Value::Null))
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(caudal()).envs(self.env.iter().map(|(k, v)| (k, v))).args(args).output().unwrap()
    }

    pub fn submit(&self, parallelism: u32, job_args: &[String]) -> Output {
        Command::new(caudal())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("submit")
            .arg(temperature())
            .args(["--jobmanager", &self.url(), "--parallelism", &parallelism.to_string(), "--"])
            .args(job_args)
            .output()
            .unwrap()
    }

    pub fn job(&self, name: &str) -> Option<Value> {
        self.get("/api/v1/cluster/jobs")?.as_array()?.iter().find(|j| j["name"] == name).cloned()
    }

    /// Waits until `pred` holds for the job; panics with the logs after `secs`.
    pub fn wait_job(&self, name: &str, secs: u64, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let job = self.job(name);
            if let Some(j) = job.as_ref().filter(|j| pred(j)) {
                return j.clone();
            }
            assert!(
                Instant::now() < deadline,
                "job `{name}`: not {what} after {secs}s: {job:#?}{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill_taskmanager(&mut self, name: &str) {
        let i =
            self.tms.iter().position(|(n, _)| n == name).unwrap_or_else(|| panic!("no task manager {name}"));
        let (_, mut child) = self.tms.remove(i);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    /// Once job `job` runs with a completed checkpoint, SIGKILLs the first task manager it
    /// runs on and starts `replacement` with `slots`; waits (at most `secs`) until the job
    /// finished after at least one restart, and answers it.
    pub fn kill_a_task_manager_of(&mut self, job: &str, replacement: &str, slots: u32, secs: u64) -> Value {
        let running = self.wait_job(job, 60, "running with a checkpoint", |j| {
            status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
        });
        let victim = running["task_managers"][0].as_str().unwrap().to_string();
        self.kill_taskmanager(&victim);
        self.start_taskmanager(replacement, slots);
        let done = self.wait_job(job, secs, "FINISHED", |j| status(j) == "FINISHED");
        assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}{}", self.logs());
        done
    }

    /// The pids of task manager `name` and of its executors (its child processes).
    pub fn taskmanager_pids(&self, name: &str) -> Vec<u32> {
        let (_, child) =
            self.tms.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no task manager {name}"));
        let tm = child.id();
        let children = std::fs::read_to_string(format!("/proc/{tm}/task/{tm}/children")).unwrap_or_default();
        std::iter::once(tm).chain(children.split_whitespace().filter_map(|p| p.parse().ok())).collect()
    }

    /// Pauses task manager `victim` with its executors (SIGSTOP: a long GC pause, a frozen
    /// VM) until job `job` runs again without it — a new attempt than `running`'s, RUNNING —
    /// then resumes them (SIGCONT) and waits (at most 20 s) until its old executors exited.
    pub fn pause_until_the_job_moved_on(&self, job: &str, victim: &str, running: &Value) {
        let pids = self.taskmanager_pids(victim);
        assert!(pids.len() >= 2, "{victim} runs no executor: {pids:?}");
        Cluster::signal(&pids, "STOP");
        let attempt = running["attempt"].as_u64().unwrap();
        let moved = self.wait_job(job, 30, "running again without it", |j| {
            j["attempt"].as_u64() > Some(attempt) && status(j) == "RUNNING"
        });
        assert!(!moved["task_managers"].as_array().unwrap().iter().any(|t| t == victim), "{moved:#}");
        // An executor may be gone by now (CI once saw one vanish while paused): one that no
        // longer exists writes nothing, which is what the test checks after.
        for pid in &pids {
            let out = Command::new("kill").args(["-CONT", &pid.to_string()]).output().unwrap();
            let gone = String::from_utf8_lossy(&out.stderr).contains("No such process");
            assert!(
                out.status.success() || gone,
                "kill -CONT {pid}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for executor in &pids[1..] {
            let alive = || {
                std::fs::read_to_string(format!("/proc/{executor}/stat")).is_ok_and(|s| !s.contains(") Z "))
            };
            while alive() {
                assert!(
                    Instant::now() < deadline,
                    "the paused executor {executor} still runs 20 s after it resumed"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to `pids`, as `kill -<signal>` does.
    pub fn signal(pids: &[u32], signal: &str) {
        let out = Command::new("kill")
            .arg(format!("-{signal}"))
            .args(pids.iter().map(u32::to_string))
            .output()
            .unwrap();
        assert!(out.status.success(), "kill -{signal} {pids:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Waits (at most `secs`) until the job manager's process ends by itself.
    pub fn wait_jobmanager_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let jm = self.jm.as_mut().unwrap();
        loop {
            if let Some(status) = jm.try_wait().unwrap() {
                self.jm = None;
                return status;
            }
            assert!(Instant::now() < deadline, "the job manager still runs after {secs}s:{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill_jobmanager(&mut self) {
        let mut jm = self.jm.take().unwrap();
        jm.kill().unwrap(); // SIGKILL
        jm.wait().unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.tms {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(jm) = &mut self.jm {
            let _ = jm.kill();
            let _ = jm.wait();
        }
    }
}

pub fn status(job: &Value) -> &str {
    job["status"].as_str().unwrap_or_default()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Published output: every `*.jsonl` line of `dir/<folder>`, sorted.
pub fn published(dir: &Path, folder: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(dir.join(folder)).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            lines.extend(std::fs::read_to_string(&p).unwrap().lines().map(str::to_string));
        }
    }
    lines.sort();
    lines
}

/// `run_args` (the oracle's flags) without the UI, the generator throttled to `rate` records/s,
/// output into `out`.
pub fn throttled_args(run_args: &[&str], rate: u32, out: &Path) -> Vec<String> {
    let mut args: Vec<String> = run_args.iter().chain(&["--no-ui"]).map(|s| s.to_string()).collect();
    let at = args.iter().position(|a| a == "--rate").unwrap() + 1;
    args[at] = rate.to_string();
    args.extend(["--output".into(), out.display().to_string()]);
    args
}

/// Waits (up to 20 s) until the job manager has refused the control connections of the
/// task managers `intruders`, then checks that none of them registered.
pub fn assert_refused(c: &Cluster, intruders: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.logs().matches("control connection refused").count() < intruders.len() {
        assert!(Instant::now() < deadline, "the intruders were not refused:{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_not_registered(c, intruders);
}

/// None of `intruders` is among the job manager's task managers.
pub fn assert_not_registered(c: &Cluster, intruders: &[&str]) {
    let info = c.get("/api/v1/cluster").unwrap();
    let names: Vec<&str> =
        info["task_managers"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(intruders.iter().all(|i| !names.contains(i)), "{names:?}");
}

/// Waits for the temperature job to finish without a restart, then compares what it
/// published in `out` with `expected` (windows, readings), computed without the engine.
pub fn assert_finished_exactly(c: &Cluster, out: &Path, expected: &(Vec<String>, Vec<String>)) {
    let done = c.wait_job("temperature", 90, "FINISHED", |j| status(j) == "FINISHED");
    assert_eq!(done["restarts"], 0, "the intruders disturbed nothing: {done:#}");
    let (windows, readings) = expected;
    assert!(published(out, "readings") == *readings, "readings differ from what the input implies");
    assert!(published(out, "windows") == *windows, "windows differ from what the input implies");
}
