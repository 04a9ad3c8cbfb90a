//! Tools a test needs (mpirun, Chromium, NVRTC, NCCL): where one is missing, a test on a
//! developer's machine says so and skips, but where the tool is required it fails,
//! naming the tool and its install. A tool is required under `CI=true` (CI sets it) or
//! under its own switch, `HEADROOM_REQUIRE_<TOOL>=1`, so a CI machine whose install
//! silently failed cannot report green.

/// Whether the tool of switch `HEADROOM_REQUIRE_<tool>` must be present here.
pub fn is_required(tool: &str) -> bool {
    let var = |name: &str| std::env::var(name).ok();
    required_by(
        var("CI").as_deref(),
        var(&format!("HEADROOM_REQUIRE_{}", tool.to_ascii_uppercase())).as_deref(),
    )
}

/// Whether `CI` and a tool's switch, as set, require it.
fn required_by(ci: Option<&str>, switch: Option<&str>) -> bool {
    let set = |v: Option<&str>| matches!(v, Some("1" | "true"));
    set(ci) || set(switch)
}

/// Says that `tool` is missing (`why`) and how to install it (`install`): a skip note,
/// or, where the tool is required, a panic that fails the test.
pub fn missing(tool: &str, why: &str, install: &str) {
    if is_required(tool) {
        panic!(
            "{tool} is required here (CI=true or HEADROOM_REQUIRE_{}=1) but missing: {why}; did its install fail? ({install})",
            tool.to_ascii_uppercase()
        );
    }
    eprintln!("skipped: {tool} is missing: {why} ({install})");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_or_the_tools_switch_requires_it() {
        assert!(required_by(Some("true"), None));
        assert!(required_by(None, Some("1")));
        assert!(!required_by(None, None));
        assert!(!required_by(Some("false"), Some("0")));
    }

    #[test]
    fn a_required_tool_that_is_missing_fails_naming_it() {
        if !is_required("no-such-tool") {
            // Here the missing tool is a note; the failing side needs `CI=true`.
            missing("no-such-tool", "not on PATH", "apt");
            return;
        }
        let err =
            std::panic::catch_unwind(|| missing("no-such-tool", "not on PATH", "apt")).unwrap_err();
        let text = err.downcast_ref::<String>().unwrap();
        assert!(text.contains("no-such-tool is required"), "{text}");
    }
}
