//! `headroom_tensor::io::npy::parse_npy` on arbitrary bytes, onto the CPU.
#![no_main]

use headroom_tensor::io::npy::parse_npy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_npy(data, headroom_fuzz::cpu());
});
