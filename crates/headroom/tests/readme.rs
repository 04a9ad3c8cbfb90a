//! The README's and the docs' command lines work when copied: every `headroom generate`
//! and `headroom plan` line in the code blocks of README.md and of every `*.md` under
//! docs/ runs (generate on the tiny model at 48×32, everything else as written), and every
//! other `headroom` line's flags are ones the binary has.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A line or block of a markdown file, with the file's path from the repository root.
struct Found {
    file: String,
    text: String,
}

/// The shell lines inside code blocks, continuations joined, comments dropped.
fn code_lines() -> Vec<Found> {
    let mut lines = Vec::new();
    for Found { file, text: block } in ["", "sh", "bash"].into_iter().flat_map(blocks) {
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
            lines.push(Found {
                file: file.clone(),
                text: std::mem::take(&mut pending),
            });
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

/// Runs `headroom args` for the line `line` of `file`, which must succeed.
fn run_line(file: &str, line: &str, args: &[String]) {
    let res = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{file}: line {line:?} failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
}

#[test]
fn every_generate_and_plan_line_in_the_docs_runs_and_every_flag_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ran, mut parsed) = (0, 0);
    for Found { file, text: line } in code_lines() {
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
            run_line(&file, &line, &args);
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
            run_line(&file, &line, &args);
            ran += 1;
        } else {
            // The flags exist: clap stops at --help only after every flag before it
            // parsed.
            args.push("--help".into());
            run_line(&file, &line, &args);
            parsed += 1;
        }
    }
    assert!(ran >= 4 && parsed >= 5, "ran {ran}, parsed {parsed}");
}

#[test]
fn the_quick_start_flight_gives_one_key_set_per_latent_frame() {
    let flight = code_lines()
        .into_iter()
        .find(|l| l.file == "README.md" && l.text.contains("generate --actions"))
        .expect("the README's quick start flies")
        .text;
    let args = headroom_args(&flight).unwrap();
    let i = args.iter().position(|a| a == "--actions").unwrap();
    let keys = headroom_model::camera::Keys::script(&args[i + 1]).unwrap();
    // The default 33 frames are (33 + 3) / 4 = 9 latent frames.
    assert_eq!(keys.len(), 9, "{flight}");
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `*.md` files under `dir` (relative to the root), recursively.
fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{} is readable: {e}", dir.display()));
    for entry in entries {
        let path = dir.join(entry.unwrap().file_name());
        if root().join(&path).is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// README.md, then every `*.md` under docs/ in sorted order, each as (path, text).
fn documents() -> Vec<(String, String)> {
    let mut docs = Vec::new();
    markdown_under(Path::new("docs"), &mut docs);
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds markdown files");
    std::iter::once(PathBuf::from("README.md"))
        .chain(docs)
        .map(|path| {
            let text = std::fs::read_to_string(root().join(&path))
                .unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()));
            (path.display().to_string(), text)
        })
        .collect()
}

/// The fenced blocks of `lang` in README.md and docs/, each as one text.
fn blocks(lang: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let fence = format!("```{lang}");
    for (file, text) in documents() {
        let mut current: Option<String> = None;
        let mut other = false;
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with("```") {
                match current.take() {
                    Some(block) => out.push(Found {
                        file: file.clone(),
                        text: block,
                    }),
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
        assert!(
            current.is_none() && !other,
            "{file}: a code block is not closed"
        );
    }
    out
}

/// Checks one realtime message of `file` as the server would take it.
fn check_message(file: &str, text: &str) {
    use headroom_server::{ClientMessage, Defaults, Interaction, Limits, StartRequest};
    let parsed = ClientMessage::parse(text).unwrap_or_else(|e| panic!("{file}: {text}: {e}"));
    match parsed {
        ClientMessage::Start(map) => {
            StartRequest::parse(&map, &Defaults::default())
                .unwrap_or_else(|e| panic!("{file}: {text}: {e}"));
        }
        ClientMessage::Interaction(map) => {
            Interaction::parse(&map, &Limits::default(), || "fresh".into())
                .unwrap_or_else(|e| panic!("{file}: {text}: {e}"));
        }
        ClientMessage::Ping
        | ClientMessage::Stop
        | ClientMessage::Pause
        | ClientMessage::Resume => {}
    }
}

#[test]
fn every_json_message_and_trace_in_the_docs_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut messages, mut traces) = (0, 0);
    for Found { file, text: block } in blocks("json") {
        let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.iter().all(|l| l.trim_start().starts_with("{\"op\"")) {
            // An allocation trace: `headroom mem replay` takes it.
            let path = dir.path().join(format!("trace-{traces}.jsonl"));
            std::fs::write(&path, &block).unwrap();
            let res = common::headroom(&["mem", "replay", path.to_str().unwrap()]);
            assert!(
                res.status.success(),
                "{file}: the trace {block:?} does not replay: {}",
                String::from_utf8_lossy(&res.stderr)
            );
            traces += 1;
        } else {
            check_message(&file, &block);
            messages += 1;
        }
    }
    // The Python client's messages, as it sends them.
    for Found { file, text: block } in blocks("python") {
        for line in block.lines() {
            if let Some(start) = line.find("json.dumps(") {
                let inner = &line[start + "json.dumps(".len()..];
                let end = inner
                    .rfind("))")
                    .unwrap_or_else(|| panic!("{file}: one call per line: {line}"));
                check_message(&file, &inner[..end]);
                messages += 1;
            }
        }
    }
    assert!(
        messages >= 2 && traces >= 1,
        "{messages} messages, {traces} traces"
    );
}
