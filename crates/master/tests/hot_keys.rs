//! Hot-key replicas (`dynamic_replication_mode`): heat counting, the copy task a hot key gets in
//! enforce mode, reads spread over the replicas, nothing copied in observe mode, and extra
//! replicas dropped by eviction before any whole object.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    ObjectMeta, ReplicaType, ReplicateConfig, TaskCompleteRequest, TaskStatus, TaskType,
};
use mooncake_master::{DynamicReplicationMode, MasterService, MasterServiceConfig};

/// 10 s window at 0.5 reads/s: the 5th read within a window makes a key hot.
const HOT_READS: usize = 5;

fn config(mode: DynamicReplicationMode) -> MasterServiceConfig {
    MasterServiceConfig {
        dynamic_replication_mode: mode,
        dynamic_replication_heat_window_sec: 10,
        dynamic_replication_admission_qps_threshold: 0.5,
        dynamic_replication_max_memory_replicas: 2,
        eviction_high_watermark_ratio: 0.5,
        ..Default::default()
    }
}

/// Segments "a" (owned by C1) and "b" (owned by C2), 1 MiB each.
fn two_nodes(mode: DynamicReplicationMode) -> MasterService {
    let (_, m) = master_with(config(mode));
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    m
}

fn put_on(m: &MasterService, key: &str, size: u64, name: &str) {
    let on = ReplicateConfig {
        preferred_segments: vec![name.to_string()],
        ..cfg(1)
    };
    m.put_start(C1, key, size, &on, "").unwrap();
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

/// A read as the server serves it: the answer, then its heat.
fn read(m: &MasterService, key: &str) -> Vec<String> {
    let mut reply = m.get_replica_list(key, "");
    m.note_heat(key, "", &mut reply);
    reply
        .unwrap()
        .replicas
        .iter()
        .filter_map(|d| d.memory().map(|x| x.transport_endpoint.to_string()))
        .collect()
}

/// Runs the copy task queued for C1 as a node would (CopyStart, CopyEnd, report).
fn run_copy_task(m: &MasterService, key: &str) {
    let tasks = m.fetch_tasks(C1, 16);
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let task = &tasks[0];
    assert_eq!(task.task_type, TaskType::ReplicaCopy);
    assert_eq!((task.key.as_str(), task.source.as_str()), (key, "a"));
    assert_eq!(task.targets, vec!["b".to_string()]);
    m.copy_start(C1, key, "", &task.source, &task.targets)
        .unwrap();
    m.copy_end(C1, key, "").unwrap();
    let done = TaskCompleteRequest {
        id: task.id,
        status: TaskStatus::Success,
        message: String::new(),
    };
    m.mark_task_to_complete(C1, &done).unwrap();
}

/// Reads `key` until it is hot and runs the copy task it got.
fn make_hot(m: &MasterService, key: &str) {
    for _ in 0..HOT_READS - 1 {
        read(m, key);
    }
    assert!(m.fetch_tasks(C1, 16).is_empty(), "not hot yet");
    read(m, key);
    run_copy_task(m, key);
}

#[test]
fn a_hot_key_gets_one_extra_replica_and_reads_alternate() {
    let m = two_nodes(DynamicReplicationMode::Enforce);
    put_on(&m, "hot", 100, "a");
    put_on(&m, "cold", 100, "a");
    make_hot(&m, "hot");
    let mut firsts: Vec<String> = (0..4).map(|_| read(&m, "hot")[0].clone()).collect();
    firsts.sort();
    firsts.dedup();
    assert_eq!(firsts, vec!["ep-a", "ep-b"], "reads alternate");
    // At the maximum of memory replicas: no further task, however hot.
    for _ in 0..20 {
        read(&m, "hot");
    }
    assert!(m.fetch_tasks(C1, 16).is_empty() && m.fetch_tasks(C2, 16).is_empty());
    for _ in 0..HOT_READS - 1 {
        assert_eq!(read(&m, "cold"), vec!["ep-a"]);
    }
    assert!(m.fetch_tasks(C1, 16).is_empty(), "a cold key gets nothing");
    let s = m.hot_key_stats();
    assert_eq!((s.hot_keys, s.tasks_queued, s.extras), (1, 1, 1));
    let led: Vec<&str> = s.reads_led.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(led, vec!["ep-a", "ep-b"]);
    assert_accounting(&m);
}

#[test]
fn observe_mode_counts_hot_keys_and_copies_nothing() {
    let m = two_nodes(DynamicReplicationMode::Observe);
    put_on(&m, "hot", 100, "a");
    for _ in 0..HOT_READS * 3 {
        assert_eq!(read(&m, "hot"), vec!["ep-a"]);
    }
    assert!(m.fetch_tasks(C1, 16).is_empty());
    let s = m.hot_key_stats();
    assert_eq!((s.hot_keys, s.tasks_queued), (1, 0), "judged hot once");
    assert_eq!(s.reads_counted, (HOT_READS * 3) as u64);
}

#[test]
fn off_mode_counts_nothing() {
    let m = two_nodes(DynamicReplicationMode::Off);
    put_on(&m, "hot", 100, "a");
    for _ in 0..HOT_READS * 3 {
        read(&m, "hot");
    }
    assert!(m.fetch_tasks(C1, 16).is_empty());
    assert_eq!(m.hot_key_stats().reads_counted, 0);
}

#[test]
fn eviction_drops_extra_replicas_before_any_object() {
    let (clock, m) = master_with(config(DynamicReplicationMode::Enforce));
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    put_on(&m, "hot", 256 << 10, "a");
    make_hot(&m, "hot");
    assert_eq!(read(&m, "hot").len(), 2);
    let cold: Vec<String> = (0..5).map(|i| format!("cold{i}")).collect();
    for k in &cold {
        put(&m, C1, k, 128 << 10, 1);
    }
    // 512 KiB + 640 KiB of 2 MiB: over the 0.5 watermark. Past the hot key's read lease.
    clock.advance(LEASE_MS + 1);
    let report = m.run_eviction_once();
    assert!(report.triggered);
    assert_eq!(report.evicted_objects, 0, "{report:?}");
    assert!(report.usage_ratio_after <= 0.5, "{report:?}");
    assert_eq!(read(&m, "hot"), vec!["ep-a"], "the extra replica went");
    for k in &cold {
        assert!(m.get_replica_list(k, "").is_ok(), "{k} was evicted");
    }
    let s = m.hot_key_stats();
    assert_eq!((s.extras_dropped, s.extras_dropped_bytes), (1, 256 << 10));
    assert_eq!(s.extras, 0);
    assert_accounting(&m);
}

#[test]
fn a_key_hot_again_while_its_copy_is_queued_gets_no_second_task() {
    let (clock, m) = master_with(config(DynamicReplicationMode::Enforce));
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    put_on(&m, "hot", 100, "a");
    for _ in 0..HOT_READS {
        read(&m, "hot");
    }
    // Past the cooldown and into a new window, hot again before the node fetched the task.
    clock.advance(30_000);
    for _ in 0..HOT_READS {
        read(&m, "hot");
    }
    assert_eq!(m.hot_key_stats().tasks_queued, 1);
    run_copy_task(&m, "hot");
}
