//! Tests of `driver`.

use super::*;

#[test]
fn logs_rotate_past_the_limit_keeping_n_copies_and_appending_on() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stdout.log");
    // The process's handle: append mode, as the driver opens it.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    for round in 0..4u8 {
        f.write_all(&[b'a' + round; 100]).unwrap();
        assert!(!rotate_one(&log, 150, 2).unwrap(), "under the limit");
        f.write_all(&[b'a' + round; 100]).unwrap();
        assert!(rotate_one(&log, 150, 2).unwrap(), "over the limit");
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
    }
    // Two copies kept: the last two rounds, newest in `.1`.
    let read = |n: &str| std::fs::read(dir.path().join(n)).unwrap();
    assert_eq!(read("stdout.log.1"), vec![b'd'; 200]);
    assert_eq!(read("stdout.log.2"), vec![b'c'; 200]);
    assert!(!dir.path().join("stdout.log.3").exists());
    // The process writes on at the start of the emptied file.
    f.write_all(b"after").unwrap();
    assert_eq!(read("stdout.log"), b"after");
}

#[test]
fn report_socket_fits_a_unix_address_however_deep_the_work_dir() {
    let short = Path::new("/var/lib/fmsched/job-1");
    assert_eq!(report_socket_path(short), short.join("report.sock"));
    let deep = Path::new("/tmp/.tmpRaAlsg/node-b").join(format!(
        "{}_{}",
        "01a20133-cb9c-773b-85f7-d66b0ba9df09", "01a20133-d17c-7267-afe8-1778c8d7e9b0"
    ));
    let p = report_socket_path(&deep);
    assert!(p.as_os_str().len() <= 107, "{}", p.display());
    // One folder, one socket; another folder, another socket.
    assert_eq!(p, report_socket_path(&deep));
    assert_ne!(p, report_socket_path(&deep.join("x")));
    // And it can really be bound.
    let _ = std::fs::remove_file(&p);
    let l = std::os::unix::net::UnixListener::bind(&p).expect("binds");
    drop(l);
    std::fs::remove_file(&p).unwrap();
}
