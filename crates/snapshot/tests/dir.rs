//! The snapshot directory: retention, temp files, and loading the newest snapshot that
//! verifies, with the skipped files and their reasons.
#![allow(clippy::unwrap_used)]

mod live;

use std::fs;

use mooncake_snapshot::{EncodeOptions, SnapshotDir, SnapshotError};

#[test]
fn three_takes_with_retention_two_leave_the_two_newest() {
    let tmp = tempfile::tempdir().unwrap();
    let m = live::populated(50);
    let dir = SnapshotDir::open(tmp.path(), 2).unwrap();
    let reports: Vec<_> = (0..3)
        .map(|i| dir.take(&m, i, &EncodeOptions::default()).unwrap())
        .collect();
    assert!(reports.iter().all(|r| r.objects == 50 && r.bytes > 0));
    assert!(reports.windows(2).all(|w| w[0].path < w[1].path));
    let list = dir.list().unwrap();
    let paths: Vec<_> = list.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(
        paths,
        vec![reports[2].path.clone(), reports[1].path.clone()]
    );
    assert!(list[0].0 > list[1].0);
    assert!(!reports[0].path.exists());
    assert_eq!(
        fs::metadata(&reports[2].path).unwrap().len(),
        reports[2].bytes
    );
    let out = dir.load_newest().unwrap();
    let (path, meta, state) = out.loaded.unwrap();
    assert_eq!(path, reports[2].path);
    assert_eq!(meta.oplog_position, 2);
    assert_eq!(live::sorted(state), m.export_state());
    assert!(out.skipped.is_empty());
}

#[test]
fn a_leftover_temp_file_is_ignored_and_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let temp = tmp.path().join("snapshot-00000000000000000009.mcs.tmp");
    fs::write(&temp, b"half a snapshot").unwrap();
    let other = tmp.path().join("notes.txt");
    fs::write(&other, b"kept").unwrap();
    let dir = SnapshotDir::open(tmp.path(), 2).unwrap();
    assert!(!temp.exists());
    assert!(other.exists());
    assert!(dir.list().unwrap().is_empty());
    let out = dir.load_newest().unwrap();
    assert!(out.loaded.is_none() && out.skipped.is_empty());
}

#[test]
fn a_temp_file_another_take_still_holds_is_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let temp = tmp.path().join("snapshot-00000000000000000009.mcs.tmp");
    let writing = fs::File::create(&temp).unwrap();
    writing.lock().unwrap();
    // A second master opening the shared directory while the first one writes.
    SnapshotDir::open(tmp.path(), 2).unwrap();
    assert!(temp.exists(), "a take in progress lost its temp file");
    drop(writing);
    SnapshotDir::open(tmp.path(), 2).unwrap();
    assert!(!temp.exists(), "an abandoned temp file was kept");
}

#[test]
fn a_corrupt_newest_snapshot_falls_back_to_the_older_one() {
    let tmp = tempfile::tempdir().unwrap();
    let m = live::populated(40);
    let dir = SnapshotDir::open(tmp.path(), 2).unwrap();
    let old = dir.take(&m, 1, &EncodeOptions::default()).unwrap();
    let new = dir.take(&m, 2, &EncodeOptions::default()).unwrap();
    let mut bytes = fs::read(&new.path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    fs::write(&new.path, &bytes).unwrap();
    let out = dir.load_newest().unwrap();
    let (path, meta, state) = out.loaded.unwrap();
    assert_eq!(path, old.path);
    assert_eq!(meta.oplog_position, 1);
    assert_eq!(state.objects.len(), 40);
    assert_eq!(out.skipped.len(), 1);
    assert_eq!(out.skipped[0].0, new.path);
    assert!(matches!(out.skipped[0].1, SnapshotError::Corrupt { .. }));
    assert!(
        out.skipped[0].1.to_string().contains("CRC"),
        "{}",
        out.skipped[0].1
    );
}

#[test]
fn both_snapshots_bad_loads_nothing_and_names_both() {
    let tmp = tempfile::tempdir().unwrap();
    let m = live::populated(20);
    let dir = SnapshotDir::open(tmp.path(), 2).unwrap();
    let old = dir.take(&m, 1, &EncodeOptions::default()).unwrap();
    let new = dir.take(&m, 2, &EncodeOptions::default()).unwrap();
    let bytes = fs::read(&new.path).unwrap();
    fs::write(&new.path, &bytes[..bytes.len() - 5]).unwrap();
    let mut bytes = fs::read(&old.path).unwrap();
    bytes[3] ^= 1;
    fs::write(&old.path, &bytes).unwrap();
    let out = dir.load_newest().unwrap();
    assert!(out.loaded.is_none());
    let skipped: Vec<_> = out.skipped.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(skipped, vec![new.path.clone(), old.path.clone()]);
    assert!(matches!(out.skipped[0].1, SnapshotError::Truncated { .. }));
    assert!(matches!(out.skipped[1].1, SnapshotError::Corrupt { .. }));
}

#[test]
fn ids_increase_even_within_one_millisecond_and_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let m = live::populated(5);
    let mut last = 0;
    for round in 0..2 {
        let dir = SnapshotDir::open(tmp.path(), 10).unwrap();
        for _ in 0..3 {
            let r = dir.take(&m, round, &EncodeOptions::default()).unwrap();
            let id = dir.list().unwrap()[0].0;
            assert!(id > last, "{id} after {last}");
            assert_eq!(r.path, dir.list().unwrap()[0].1);
            last = id;
        }
    }
    assert_eq!(
        SnapshotDir::open(tmp.path(), 10)
            .unwrap()
            .list()
            .unwrap()
            .len(),
        6
    );
}

#[test]
fn a_clean_shutdown_mark_is_reported_until_cleared_and_only_on_the_newest_good_file() {
    let tmp = tempfile::tempdir().unwrap();
    let m = live::populated(10);
    let dir = SnapshotDir::open(tmp.path(), 2).unwrap();
    let first = dir.take(&m, 1, &EncodeOptions::default()).unwrap();
    assert!(!dir.load_newest().unwrap().is_final);
    dir.mark_final(&first).unwrap();
    let out = dir.load_newest().unwrap();
    assert!(out.is_final);
    assert_eq!(out.loaded.unwrap().0, first.path);
    // The mark is not a snapshot: listing and loading ignore it.
    assert_eq!(dir.list().unwrap().len(), 1);
    assert_eq!(dir.clear_final_marks().unwrap(), 1);
    assert!(!dir.load_newest().unwrap().is_final);
    assert_eq!(dir.clear_final_marks().unwrap(), 0);

    // A newer file that does not verify means a master ran after the marked one: not final.
    dir.mark_final(&first).unwrap();
    let newer = dir.take(&m, 2, &EncodeOptions::default()).unwrap();
    fs::write(&newer.path, b"not a snapshot").unwrap();
    let out = dir.load_newest().unwrap();
    assert_eq!(out.loaded.unwrap().0, first.path);
    assert_eq!(out.skipped.len(), 1);
    assert!(!out.is_final);

    // Retention removes a pruned snapshot's mark with it.
    let third = dir.take(&m, 3, &EncodeOptions::default()).unwrap();
    assert!(!first.path.exists());
    assert_eq!(dir.final_marks().unwrap(), Vec::<u64>::new());
    dir.mark_final(&third).unwrap();
    assert_eq!(dir.final_marks().unwrap(), vec![third.id]);
    assert!(dir.load_newest().unwrap().is_final);
}

#[test]
fn a_directory_that_cannot_hold_files_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let err = SnapshotDir::open(file.join("snapshots"), 2).unwrap_err();
    assert!(matches!(err, SnapshotError::Io(_)), "{err}");
}
