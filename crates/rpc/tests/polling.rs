//! Busy polling's verdicts over real loopback sockets: a caller told that spinning does not pay
//! does not spin (its CPU stays bounded while it waits), every sequential caller on its own
//! thread reads its own answer whatever the verdict, and a reader that leaves the socket to a
//! polling caller still notices the server hanging up.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, BytesMut};
use mooncake_common::ErrorCode;
use mooncake_rpc::{
    ClientConfig, Handler, HandlerError, HostLoad, PollPolicy, PollStats, RpcClient, RpcServer,
    ServerConfig,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

const ECHO: u16 = 1;

struct Echo;

impl Handler for Echo {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        if method != ECHO {
            return Err(HandlerError::new(ErrorCode::INVALID_PARAMS, "unknown"));
        }
        out.put_slice(body);
        Ok(())
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A host reading on which a spinner would leave no core for anyone else.
const BUSY: PollPolicy = PollPolicy::AdaptiveWith(HostLoad {
    others_runnable: 6.0,
    cores: 2,
    waiting_for_cpu: Some(0.4),
});
/// A host reading with cores to spare.
const IDLE: PollPolicy = PollPolicy::AdaptiveWith(HostLoad {
    others_runnable: 0.0,
    cores: 8,
    waiting_for_cpu: None,
});

fn new_client(addr: SocketAddr, policy: PollPolicy, timeout: Duration) -> RpcClient {
    RpcClient::new(
        addr,
        ClientConfig {
            call_timeout: timeout,
            busy_poll: Some(Duration::from_micros(100)),
            poll_policy: policy,
            ..ClientConfig::default()
        },
    )
}

/// CPU time this process has used (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// A server that accepts and reads everything, answering nothing.
fn silent_server(rt: &Runtime) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(loopback()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let sink = rt.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (addr, sink)
}

/// With the verdict forced to "the host is busy", a call that waits 600 ms for a silent server
/// does not spin: not the caller on its own thread (it waits on the socket), not the reader
/// task for a task's call. The same wait with cores to spare spins once, for its budget only.
#[test]
fn a_caller_told_the_host_is_busy_does_not_spin_while_it_waits() {
    let rt = Arc::new(Runtime::new().unwrap());
    let (addr, sink) = silent_server(&rt);
    for policy in [BUSY, IDLE] {
        let client = Arc::new(new_client(addr, policy, Duration::from_millis(600)));
        for from_task in [false, true] {
            let before = cpu_time();
            let started = Instant::now();
            let caller = Arc::clone(&client);
            let error = if from_task {
                rt.block_on(rt.spawn(async move { caller.call(ECHO, b"anyone?").await }))
                    .unwrap()
                    .unwrap_err()
            } else {
                rt.block_on(caller.call(ECHO, b"anyone?")).unwrap_err()
            };
            assert_eq!(error.code(), ErrorCode::RPC_TIMEOUT);
            assert!(started.elapsed() >= Duration::from_millis(600));
            let used = cpu_time() - before;
            // A spinner would use most of the 600 ms; waiting costs a few wake-ups.
            assert!(
                used < Duration::from_millis(200),
                "{used:?} of CPU while waiting 600 ms ({policy:?}, from a task: {from_task})"
            );
        }
        // Only the caller on its own thread asks (a task's call leaves it to the reader).
        let stats = client.poll_stats();
        if policy == BUSY {
            assert_eq!(
                stats,
                PollStats {
                    skipped_host_busy: 1,
                    ..PollStats::default()
                }
            );
        } else {
            assert_eq!(stats.spins, 1, "{stats:?}");
            assert_eq!(stats.skipped_host_busy, 0);
        }
    }
    sink.abort();
}

/// A sequential caller on its own thread (a multi-thread runtime's `block_on`) reads its own
/// answer whether it spins or not: with spinning forced on, with the verdict "busy host" (it
/// waits on the socket instead), and with cores to spare. Every call gets a verdict.
#[test]
fn every_sequential_caller_reads_its_own_answer_whatever_the_verdict() {
    let rt = Runtime::new().unwrap();
    let server = rt
        .block_on(RpcServer::bind(
            loopback(),
            Arc::new(Echo),
            ServerConfig::default(),
        ))
        .unwrap();
    for policy in [PollPolicy::Always, BUSY, IDLE] {
        let client = new_client(server.local_addr(), policy, Duration::from_secs(10));
        for i in 0..100u32 {
            let body = i.to_le_bytes();
            assert_eq!(&rt.block_on(client.call(ECHO, &body)).unwrap()[..], &body);
        }
        let stats = client.poll_stats();
        assert!(stats.caller_reads >= 100, "{policy:?}: {stats:?}");
        assert_eq!(
            stats.spins + stats.skipped_host_busy + stats.skipped_backing_off,
            100,
            "{policy:?}: {stats:?}"
        );
        match policy {
            PollPolicy::Always => assert_eq!(stats.spins, 100, "{stats:?}"),
            BUSY => assert_eq!(stats.skipped_host_busy, 100, "{stats:?}"),
            // Spins that lost their core on this loaded machine may pause later ones.
            _ => assert_eq!(stats.skipped_host_busy, 0, "{stats:?}"),
        }
    }
    rt.block_on(server.shutdown());
}

/// Tasks' calls are read by the reader task whatever the verdict (a busy host: it parks until
/// the answer is there), and on a current-thread runtime a caller never blocks its thread (the
/// server runs on it): the answers come through the reader.
#[test]
fn tasks_and_current_thread_callers_are_served_by_the_reader() {
    let rt = Runtime::new().unwrap();
    let server = rt
        .block_on(RpcServer::bind(
            loopback(),
            Arc::new(Echo),
            ServerConfig::default(),
        ))
        .unwrap();
    let client = Arc::new(new_client(
        server.local_addr(),
        BUSY,
        Duration::from_secs(10),
    ));
    let caller = Arc::clone(&client);
    rt.block_on(rt.spawn(async move {
        for i in 0..100u32 {
            let body = i.to_le_bytes();
            assert_eq!(&caller.call(ECHO, &body).await.unwrap()[..], &body);
        }
    }))
    .unwrap();
    assert_eq!(client.poll_stats(), PollStats::default());
    rt.block_on(server.shutdown());

    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    local.block_on(async {
        let server = RpcServer::bind(loopback(), Arc::new(Echo), ServerConfig::default())
            .await
            .unwrap();
        let client = new_client(server.local_addr(), BUSY, Duration::from_secs(10));
        for i in 0..100u32 {
            let body = i.to_le_bytes();
            assert_eq!(&client.call(ECHO, &body).await.unwrap()[..], &body);
        }
        let stats = client.poll_stats();
        assert_eq!(stats.caller_reads, 0, "{stats:?}");
        assert_eq!(stats.skipped_host_busy, 100, "{stats:?}");
        server.shutdown().await;
    });
}

/// While callers read their own answers the reader task reads nothing, but it still notices
/// the server closing the connection (an idle timeout, a restart): the client lets the dead
/// connection go and the next call connects afresh instead of failing.
#[test]
fn a_server_hang_up_between_caller_reads_is_noticed() {
    let rt = Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(loopback()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    // Answers three requests per connection (echo), then hangs up.
    let server = rt.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let decoder = mooncake_proto::FrameDecoder::default();
                let mut buf = BytesMut::new();
                let mut answered = 0;
                while answered < 3 {
                    match decoder.decode(&mut buf) {
                        Ok(Some(frame)) => {
                            let mut out = BytesMut::new();
                            let header = mooncake_proto::FrameHeader {
                                kind: mooncake_proto::FrameKind::Response,
                                ..frame.header
                            };
                            mooncake_proto::encode_frame(&mut out, header, &frame.body);
                            if stream.write_all(&out).await.is_err() {
                                return;
                            }
                            answered += 1;
                        }
                        Ok(None) => match stream.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        },
                        Err(_) => return,
                    }
                }
            });
        }
    });
    for policy in [PollPolicy::Always, BUSY] {
        let client = new_client(addr, policy, Duration::from_secs(5));
        let before = accepted.load(Ordering::SeqCst);
        for round in 0..3 {
            for i in 0..3u32 {
                let body = (round * 10 + i).to_le_bytes();
                assert_eq!(&rt.block_on(client.call(ECHO, &body)).unwrap()[..], &body);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while client.is_connected() {
                assert!(
                    Instant::now() < deadline,
                    "the hang-up went unnoticed ({policy:?})"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst) - before, 3);
        assert!(client.caller_reads() >= 9);
    }
    server.abort();
}

/// A thread calling back to back (reading its own answers) and tasks calling now and then on
/// the same connection (a heartbeat): every call is answered promptly, whoever reads it.
#[test]
fn a_sequential_caller_and_occasional_task_calls_share_a_connection() {
    let rt = Arc::new(Runtime::new().unwrap());
    let server = rt
        .block_on(RpcServer::bind(
            loopback(),
            Arc::new(Echo),
            ServerConfig::default(),
        ))
        .unwrap();
    for policy in [PollPolicy::Always, BUSY, IDLE] {
        let client = Arc::new(new_client(
            server.local_addr(),
            policy,
            Duration::from_secs(5),
        ));
        let caller = Arc::clone(&client);
        let ticker = rt.spawn(async move {
            for i in 0..200u32 {
                let body = (1_000_000 + i).to_le_bytes();
                let started = Instant::now();
                assert_eq!(&caller.call(ECHO, &body).await.unwrap()[..], &body);
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "task call stalled"
                );
                tokio::time::sleep(Duration::from_micros(500 + u64::from(i % 7) * 100)).await;
            }
        });
        let mut i = 0u32;
        while !ticker.is_finished() {
            let body = i.to_le_bytes();
            let started = Instant::now();
            assert_eq!(&rt.block_on(client.call(ECHO, &body)).unwrap()[..], &body);
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "call {i} stalled ({policy:?})"
            );
            i += 1;
        }
        rt.block_on(ticker).unwrap();
    }
    rt.block_on(server.shutdown());
}

/// A task's call overlapping a thread's sequential calls now and then: the thread's following
/// calls go through the reader task (their window after an overlap), right as it stops leaving
/// the socket to the thread. No answer may be left unread: with no other traffic, a missed one
/// would only end in the call's timeout.
#[test]
fn no_answer_is_left_unread_when_the_reader_takes_over_from_a_caller() {
    let rt = Arc::new(Runtime::new().unwrap());
    let server = rt
        .block_on(RpcServer::bind(
            loopback(),
            Arc::new(Echo),
            ServerConfig::default(),
        ))
        .unwrap();
    for policy in [PollPolicy::Always, BUSY] {
        let client = Arc::new(new_client(
            server.local_addr(),
            policy,
            Duration::from_secs(5),
        ));
        for round in 0..40u32 {
            // Past the window after the last overlap: the next call reads its own answer.
            std::thread::sleep(Duration::from_millis(55));
            let caller = Arc::clone(&client);
            let task = rt.spawn(async move {
                let body = (1_000_000 + round).to_le_bytes();
                assert_eq!(&caller.call(ECHO, &body).await.unwrap()[..], &body);
            });
            for i in 0..30u32 {
                let body = (round * 100 + i).to_le_bytes();
                let answer = rt.block_on(client.call(ECHO, &body));
                assert_eq!(
                    &answer.unwrap()[..],
                    &body,
                    "round {round} call {i} ({policy:?})"
                );
            }
            rt.block_on(task).unwrap();
        }
    }
    rt.block_on(server.shutdown());
}

/// Answers each request after `delay` (longer than any spin budget here).
struct Slow {
    delay: Duration,
}

impl Handler for Slow {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        std::thread::sleep(self.delay);
        Echo.handle(method, body, out)
    }
}

/// CPU time the calling thread has used (user + system).
fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
        usage
    };
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// With cores to spare but a server that always answers after the budget (every spin runs
/// out, or loses its core and finds the answer late: either adds to the thread's debt), a
/// sequential caller stops spinning: eight spins, then a pause of one call, eight, two calls,
/// eight, four, … A pause lasts its calls, not only its time: here every call takes longer
/// than the longest pause (64 ms), so pauses of time alone would never skip a call and all 61
/// calls would spin; with the calls counted at most 40 spin, however loaded the machine, and
/// the caller's thread uses at most those spins' budgets of CPU plus the calls' own work.
#[test]
fn a_caller_whose_budget_keeps_running_out_stops_spinning() {
    let rt = Runtime::new().unwrap();
    let budget = Duration::from_millis(2);
    let delay = Duration::from_millis(70);
    let server = rt
        .block_on(RpcServer::bind(
            loopback(),
            Arc::new(Slow { delay }),
            ServerConfig::default(),
        ))
        .unwrap();
    let client = RpcClient::new(
        server.local_addr(),
        ClientConfig {
            call_timeout: Duration::from_secs(30),
            busy_poll: Some(budget),
            poll_policy: IDLE,
            ..ClientConfig::default()
        },
    );
    // Connected before measuring (the first call also pays the connection).
    assert_eq!(
        &rt.block_on(client.call(ECHO, b"hello")).unwrap()[..],
        b"hello"
    );
    let first = client.poll_stats();
    let before = thread_cpu_time();
    for i in 0..60u32 {
        let body = i.to_le_bytes();
        assert_eq!(&rt.block_on(client.call(ECHO, &body)).unwrap()[..], &body);
    }
    let used = thread_cpu_time() - before;
    let stats = client.poll_stats();
    let spins = stats.spins - first.spins;
    let skipped = stats.skipped_backing_off - first.skipped_backing_off;
    assert_eq!(stats.skipped_host_busy, 0, "{stats:?}");
    assert_eq!(spins + skipped, 60, "{stats:?}");
    assert!(stats.spins <= 40, "{stats:?}");
    assert!(
        used < budget * 40 + Duration::from_millis(100),
        "{used:?} of CPU for 60 calls of {delay:?} ({stats:?})"
    );
    rt.block_on(server.shutdown());
}
