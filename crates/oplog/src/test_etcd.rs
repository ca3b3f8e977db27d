//! For tests: a real etcd (the `etcd` binary of Debian's etcd-server), one member or a cluster,
//! on free loopback ports with a temporary data directory per member, stopped by PID (SIGKILL) when dropped or
//! killed, restartable on the same ports and data. Every failure to set it up panics: it is
//! test scaffolding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct EtcdServer {
    pub client_port: u16,
    peer_port: u16,
    name: String,
    /// `--initial-cluster`: every member's name and peer URL.
    initial_cluster: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl EtcdServer {
    /// One member.
    pub fn start() -> EtcdServer {
        let peer_port = free_port();
        let mut s = EtcdServer {
            client_port: free_port(),
            peer_port,
            name: "default".into(),
            initial_cluster: format!("default=http://127.0.0.1:{peer_port}"),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        s.restart();
        s
    }

    /// A cluster of `n` members, all started and healthy.
    pub fn start_cluster(n: usize) -> Vec<EtcdServer> {
        let peers: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let initial_cluster = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdServer> = peers
            .iter()
            .enumerate()
            .map(|(i, &peer_port)| EtcdServer {
                client_port: free_port(),
                peer_port,
                name: format!("m{i}"),
                initial_cluster: initial_cluster.clone(),
                dir: tempfile::tempdir().unwrap(),
                child: None,
            })
            .collect();
        members.iter_mut().for_each(EtcdServer::spawn);
        members.iter().for_each(EtcdServer::wait_healthy);
        members
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the process (again) on the same ports and data, and waits until it answers.
    pub fn restart(&mut self) {
        self.spawn();
        self.wait_healthy();
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none());
        let c = format!("http://127.0.0.1:{}", self.client_port);
        let p = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--name", &self.name])
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (Debian etcd-server; scripts/test installs it)");
        self.child = Some(child);
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if health(self.client_port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd did not become healthy within 60 s");
    }

    /// etcd's database file size and the part of it in use (`etcdctl endpoint status`:
    /// dbSize, dbSizeInUse), in bytes.
    pub async fn db_size(&self) -> (i64, i64) {
        let mut client = etcd_client::Client::connect([self.endpoint()], None)
            .await
            .unwrap();
        let status = client.status().await.unwrap();
        (status.db_size(), status.raft_used_db_size())
    }

    /// Defragments the member (`etcdctl defrag`): the database file shrinks to what is in use.
    pub async fn defragment(&self) {
        let mut client = etcd_client::Client::connect([self.endpoint()], None)
            .await
            .unwrap();
        client.defragment().await.unwrap();
    }

    /// SIGKILLs the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `GET /health` answers `"health":"true"`.
fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}
