//! Pose and action inputs of `headroom_model`: the first byte picks the reader, the rest
//! is its input.
//!
//! * `0`: `camera::Keys::script` (a `--actions` string such as `"ww+da-"`);
//! * `1`: `camera::Trajectory::from_json` (a `--camera` trajectory file);
//! * `2`: `import::lingbot::trajectory_from_npy` (LingBot-World `poses.npy` and
//!   `intrinsics.npy`): a little-endian u32 length, that many bytes of `poses.npy`,
//!   then `intrinsics.npy`.
//!
//! crates/model/tests/fuzz_corpus.rs replays the corpus through the same split.
#![no_main]

use std::path::Path;

use headroom_model::camera::{Keys, Trajectory};
use headroom_model::import::lingbot::trajectory_from_npy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which {
        0 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = Keys::script(text);
            }
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = Trajectory::from_json(text);
            }
        }
        2 => {
            if rest.len() < 4 {
                return;
            }
            let (len, rest) = rest.split_at(4);
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let (poses, intrinsics) = rest.split_at(len.min(rest.len()));
            let _ = trajectory_from_npy(Path::new("fuzz"), poses, intrinsics, headroom_fuzz::cpu());
        }
        _ => {}
    }
});
