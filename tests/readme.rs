//! The README's curl session, run as written against a fresh host (the real guest, the memory
//! store): every answer is the one the README shows, status lines, headers and bodies, with
//! only ids, dates and timings told apart. When the service changes, this fails until the
//! README says what a user will see.

mod support;

use std::collections::HashMap;
use std::process::Command;

use support::Host;

/// One `$ ` command of the session and what the README shows it print.
#[derive(Debug)]
struct Step {
    command: String,
    shown: String,
}

/// The steps of the README's `## A session with curl` block.
fn readme_session() -> Vec<Step> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    let section = &readme[readme
        .find("## A session with curl")
        .expect("the README has its curl session")..];
    let block = &section[section.find("```console\n").expect("a console block") + 11..];
    let block = &block[..block.find("\n```").expect("the block's end")];
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_string(),
                shown: String::new(),
            });
            continued = command.ends_with('\\');
        } else if continued {
            let step = steps.last_mut().expect("a command before");
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
        } else {
            let step = steps.last_mut().expect("output after a command");
            step.shown.push_str(line);
            step.shown.push('\n');
        }
    }
    steps
}

/// Where `text` holds a UUID (8-4-4-4-12 hexadecimal digits): each one's byte range.
fn uuids(text: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let is_uuid = |at: usize| {
        bytes.len() >= at + 36
            && bytes[at..at + 36].iter().enumerate().all(|(i, byte)| {
                if [8, 13, 18, 23].contains(&i) {
                    *byte == b'-'
                } else {
                    byte.is_ascii_hexdigit()
                }
            })
    };
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if is_uuid(at) {
            found.push(at..at + 36);
            at += 36;
        } else {
            at += 1;
        }
    }
    found
}

/// `text` with what differs from run to run made the same: every UUID but the all-zero one, the
/// `date` header, and a `duration_ms`.
fn comparable(text: &str) -> String {
    let mut out = text.trim_end().replace('\r', "");
    for range in uuids(&out).into_iter().rev() {
        if !out[range.clone()].starts_with("00000000") {
            out.replace_range(range, "<uuid>");
        }
    }
    out.lines()
        .map(|line| {
            if line.starts_with("date: ") {
                "date: <date>".to_string()
            } else if let Some(at) = line.find("\"duration_ms\":") {
                let digits = &line[at + 14..];
                let end = digits
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(digits.len());
                format!("{}<ms>{}", &line[..at + 14], &digits[end..])
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_curl_session_shows_what_a_fresh_host_answers() {
    let host = Host::builder().start();
    let steps = readme_session();
    assert!(steps.len() >= 10, "{steps:#?}");
    // The ids the README shows stand for the ids this host makes, in the order they appear.
    let mut ids: HashMap<String, String> = HashMap::new();
    for step in &steps {
        let mut command = step.command.replace("localhost:8080", host.authority());
        for (shown, made) in &ids {
            command = command.replace(shown.as_str(), made);
        }
        let output = Command::new("bash")
            .arg("-c")
            .arg(&command)
            .output()
            .expect("bash runs the command");
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(
            comparable(&printed),
            comparable(&step.shown),
            "the README's `{}`",
            step.command
        );
        for (shown, made) in uuids(&step.shown).into_iter().zip(uuids(&printed)) {
            ids.entry(step.shown[shown].to_string())
                .or_insert_with(|| printed[made].to_string());
        }
    }
}
