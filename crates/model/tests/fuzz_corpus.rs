//! Replays the `camera` and `config` fuzz corpora (fuzz/corpus/, grown by fuzz/run.sh)
//! through the readers their targets call: every input must come back as a value or an
//! error, never a panic. No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;
#[path = "../../../fuzz/entries/model_configs.rs"]
mod entry;
use entry::model_configs;

use headroom_model::camera::{Keys, Trajectory};
use headroom_model::import::lingbot::trajectory_from_npy;
use headroom_tensor::Device;

#[test]
fn camera_corpus_replays_without_panics() {
    let cpu = Device::cpu().unwrap();
    // The input split of fuzz/fuzz_targets/camera.rs: a selector byte, then the input.
    replay("camera", |data| {
        let Some((&which, rest)) = data.split_first() else {
            return;
        };
        let text = std::str::from_utf8(rest);
        match which {
            0 => {
                let _ = text.map(Keys::script);
            }
            1 => {
                let _ = text.map(Trajectory::from_json);
            }
            2 if rest.len() >= 4 => {
                let (len, rest) = rest.split_at(4);
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                let (poses, intrinsics) = rest.split_at(len.min(rest.len()));
                let _ = trajectory_from_npy(std::path::Path::new("fuzz"), poses, intrinsics, &cpu);
            }
            _ => {}
        }
    });
}

#[test]
fn config_corpus_replays_through_the_transformer_and_vae_readers() {
    replay("config", |data| {
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        model_configs(&json);
    });
}
