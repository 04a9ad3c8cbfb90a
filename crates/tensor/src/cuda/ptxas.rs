//! Reading ptxas's `-v` report out of an NVRTC log: per entry function the registers,
//! the spill bytes (stores + loads) and the static shared memory.
//!
//! The report looks like
//! ```text
//! ptxas info    : Compiling entry function 'softmax_f32' for 'sm_90'
//! ptxas info    : Function properties for softmax_f32
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 21 registers, used 1 barriers, 128 bytes smem
//! ```

/// One entry function's resource use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PtxasEntry {
    /// The kernel's (unmangled) name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores plus spill loads.
    pub spill_bytes: u64,
    /// Bytes of local-memory stack frame.
    pub stack_bytes: u64,
    /// Bytes of static shared memory.
    pub shared_bytes: u64,
}

/// The number right before `unit` in `text` (`"21 registers"` → 21).
fn number_before(text: &str, unit: &str) -> Option<u64> {
    let at = text.find(unit)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// Every entry function reported in `log`, in log order.
pub fn parse_log(log: &str) -> Vec<PtxasEntry> {
    let mut entries: Vec<PtxasEntry> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            entries.push(PtxasEntry {
                name,
                ..PtxasEntry::default()
            });
            continue;
        }
        let Some(entry) = entries.last_mut() else {
            continue;
        };
        if line.contains("bytes spill stores") {
            entry.spill_bytes = number_before(line, "bytes spill stores").unwrap_or(0)
                + number_before(line, "bytes spill loads").unwrap_or(0);
            entry.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
        }
        if line.contains("Used ") && line.contains("registers") {
            entry.registers = number_before(line, "registers")
                .and_then(|r| u32::try_from(r).ok())
                .unwrap_or(0);
            entry.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_registers_spills_and_shared_memory_per_entry() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'a_f32' for 'sm_90'\n\
ptxas info    : Function properties for a_f32\n\
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 172 registers, used 1 barriers, 35840 bytes smem\n\
ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
ptxas info    : Used 24 registers, used 0 barriers\n";
        let e = parse_log(log);
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[0],
            PtxasEntry {
                name: "a_f32".into(),
                registers: 172,
                spill_bytes: 12,
                stack_bytes: 16,
                shared_bytes: 35840
            }
        );
        assert_eq!(
            (e[1].registers, e[1].spill_bytes, e[1].shared_bytes),
            (24, 0, 0)
        );
    }
}
