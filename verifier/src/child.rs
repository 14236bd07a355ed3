//! A child process spoken to by JSON lines (`ChildProc`): the CUDA sandbox (`crate::sandbox`)
//! and the Python candidates' runner (`crate::python`) both run their children through it, so
//! that neither imports the other for it.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};

/// A child process spoken to by JSON lines: its stdin, its stdout as lines on a channel, and
/// the tail of its stderr (kept for the error when it dies). Used by the CUDA sandbox and by
/// the Python candidates' runner (`crate::python`).
pub(crate) struct ChildProc {
    child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) lines: Receiver<String>,
    stderr_tail: Arc<Mutex<String>>,
    /// What the child is, for messages: "sandbox process", "the Python child".
    what: &'static str,
    /// The child leads a process group of its own (`in_own_group`): signals go to the group.
    group: bool,
}

impl ChildProc {
    /// Take the piped stdio of a spawned child: a thread turns stdout into lines, another keeps
    /// the last `tail_bytes` of stderr (and passes it through to ours when `pass_stderr`).
    pub(crate) fn attach(
        mut child: Child,
        what: &'static str,
        tail_bytes: usize,
        pass_stderr: bool,
    ) -> ChildProc {
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(String::new()));
        let t2 = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if pass_stderr {
                    let _ = std::io::stderr().write_all(&buf[..n]);
                }
                if let Ok(mut t) = t2.lock() {
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if t.len() > tail_bytes {
                        let cut = t.len() - tail_bytes;
                        let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(0);
                        t.drain(..cut);
                    }
                }
            }
        });
        ChildProc {
            child,
            stdin,
            lines: rx,
            stderr_tail: tail,
            what,
            group: false,
        }
    }

    /// Mark a child spawned with `process_group(0)`: `kill` and `freeze` then reach its
    /// descendants too (those that did not leave the group).
    pub(crate) fn in_own_group(mut self) -> Self {
        self.group = true;
        self
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) the child's process group, so that nothing it runs
    /// (threads included) can act while something else is measured. A stopped group orphaned by
    /// our death gets SIGHUP and SIGCONT from the kernel.
    #[cfg(unix)]
    pub(crate) fn freeze(&self, frozen: bool) {
        let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid of our own child (or its group) and a valid signal.
        unsafe {
            libc::kill(if self.group { -pid } else { pid }, sig);
        }
        // A signal is delivered asynchronously: wait (up to 200 ms) until the kernel shows the
        // child stopped, so that nothing of it runs once this returns.
        #[cfg(target_os = "linux")]
        if frozen {
            let stat = format!("/proc/{pid}/stat");
            for _ in 0..400 {
                let stopped = std::fs::read_to_string(&stat).ok().is_some_and(|s| {
                    // pid (comm) STATE ...: the state follows the last ')'.
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.trim_start().chars().next())
                        .is_some_and(|c| c == 'T' || c == 't')
                });
                if stopped {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn freeze(&self, _frozen: bool) {}

    /// Kill the child and say how it ended, with the end of its stderr.
    pub(crate) fn kill(mut self) -> String {
        #[cfg(unix)]
        if self.group {
            // SAFETY: kill(2) of our own child's process group.
            unsafe {
                libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let tail = self
            .stderr_tail
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut why = match status {
            Some(s) => format!("{} ended ({s})", self.what),
            None => format!("{} ended", self.what),
        };
        if !tail.trim().is_empty() {
            why.push_str(&format!("; its stderr ends: {}", tail.trim()));
        }
        why
    }
}
