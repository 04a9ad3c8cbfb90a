//! The README's command lines work when copied: every `headroom generate` and `headroom
//! plan` line in its code blocks runs (generate on the tiny model at 48×32, everything
//! else as written), and every other `headroom` line's flags are ones the binary has.

mod common;

use std::process::Command;

/// The README's shell lines inside code blocks, continuations joined, comments dropped.
fn code_lines() -> Vec<String> {
    let mut lines = Vec::new();
    for block in ["", "sh", "bash"].into_iter().flat_map(blocks) {
        let mut pending = String::new();
        for raw in block.lines() {
            let line = raw.trim();
            let line = match line.find(" #") {
                Some(i) => line[..i].trim_end(),
                None if line.starts_with('#') => "",
                None => line,
            };
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            lines.push(std::mem::take(&mut pending));
        }
    }
    lines
}

/// The words of a shell line (double and single quotes grouped, nothing else).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// The `headroom` arguments of a line that runs the binary, if it does.
fn headroom_args(line: &str) -> Option<Vec<String>> {
    let w = words(line);
    let skip = if w
        .first()
        .is_some_and(|c| c == "headroom" || c.ends_with("/headroom"))
    {
        1
    } else if w.len() > 5 && w[..5] == ["cargo", "run", "--release", "-p", "headroom"] {
        6
    } else {
        return None;
    };
    Some(w[skip..].to_vec())
}

/// Sets `flag`'s value to `value`, adding the flag when the line has none.
fn set(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
}

/// Runs `headroom args` for the README line `line`, which must succeed.
fn run_line(line: &str, args: &[String]) {
    let res = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "README line {line:?} failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
}

#[test]
fn every_generate_and_plan_line_in_the_readme_runs_and_every_flag_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ran, mut parsed) = (0, 0);
    for line in code_lines() {
        let Some(mut args) = headroom_args(&line) else {
            continue;
        };
        // Synopses (`--model PATH [--config FILE]`) and placeholders are not commands.
        if line.contains('[') || line.contains('|') || line.contains('…') {
            continue;
        }
        let command = args.first().cloned().unwrap_or_default();
        let gpu = args.iter().any(|a| a == "cuda" || a.starts_with("cuda:"));
        let mpi = args.iter().any(|a| a == "mpi" || a == "nccl");
        if command == "generate" && !gpu && !mpi {
            set(&mut args, "--model", "tiny");
            set(&mut args, "--width", "48");
            set(&mut args, "--height", "32");
            let out = dir.path().join(format!("readme-{ran}.mp4"));
            set(&mut args, "--out", out.to_str().unwrap());
            run_line(&line, &args);
            ran += 1;
        } else if command == "plan" {
            // One chunk of the session: the flags are what is checked, and a debug build
            // meta-executes a 14B session's ten chunks slowly.
            if !args.iter().any(|a| a == "--chunks") {
                args.extend(["--chunks".to_string(), "1".to_string()]);
            }
            // The planned allocator's placement of a 14B mesh takes minutes in a debug
            // build; its agreement with generate is held by cli_plan on small models.
            if !args.iter().any(|a| a == "--allocator") {
                args.extend(["--allocator".to_string(), "pytorch".to_string()]);
            }
            args.push("--json".into());
            run_line(&line, &args);
            ran += 1;
        } else {
            // The flags exist: clap stops at --help only after every flag before it
            // parsed.
            args.push("--help".into());
            run_line(&line, &args);
            parsed += 1;
        }
    }
    assert!(ran >= 4 && parsed >= 5, "ran {ran}, parsed {parsed}");
}

#[test]
fn the_quick_start_flight_gives_one_key_set_per_latent_frame() {
    let flight = code_lines()
        .into_iter()
        .find(|l| l.contains("generate --actions"))
        .expect("the quick start flies");
    let args = headroom_args(&flight).unwrap();
    let i = args.iter().position(|a| a == "--actions").unwrap();
    let keys = headroom_model::camera::Keys::script(&args[i + 1]).unwrap();
    // The default 33 frames are (33 + 3) / 4 = 9 latent frames.
    assert_eq!(keys.len(), 9, "{flight}");
}

/// The README's fenced blocks of `lang`, each as one text.
fn blocks(lang: &str) -> Vec<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("the README is readable");
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let fence = format!("```{lang}");
    let mut other = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            match current.take() {
                Some(block) => out.push(block),
                None if other => other = false,
                None if t == fence => current = Some(String::new()),
                None => other = true,
            }
            continue;
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    out
}

/// Checks one realtime message as the server would take it.
fn check_message(text: &str) {
    use headroom_server::{ClientMessage, Defaults, Interaction, Limits, StartRequest};
    let parsed = ClientMessage::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    match parsed {
        ClientMessage::Start(map) => {
            StartRequest::parse(&map, &Defaults::default())
                .unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        ClientMessage::Interaction(map) => {
            Interaction::parse(&map, &Limits::default(), || "fresh".into())
                .unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        ClientMessage::Ping | ClientMessage::Stop => {}
    }
}

#[test]
fn every_json_message_and_trace_in_the_readme_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut messages, mut traces) = (0, 0);
    for block in blocks("json") {
        let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.iter().all(|l| l.trim_start().starts_with("{\"op\"")) {
            // An allocation trace: `headroom mem replay` takes it.
            let path = dir.path().join(format!("trace-{traces}.jsonl"));
            std::fs::write(&path, &block).unwrap();
            let res = common::headroom(&["mem", "replay", path.to_str().unwrap()]);
            common::assert_ok(&res);
            traces += 1;
        } else {
            check_message(&block);
            messages += 1;
        }
    }
    // The Python client's messages, as it sends them.
    for block in blocks("python") {
        for line in block.lines() {
            if let Some(start) = line.find("json.dumps(") {
                let inner = &line[start + "json.dumps(".len()..];
                let end = inner.rfind("))").expect("one call per line");
                check_message(&inner[..end]);
                messages += 1;
            }
        }
    }
    assert!(
        messages >= 2 && traces >= 1,
        "{messages} messages, {traces} traces"
    );
}
