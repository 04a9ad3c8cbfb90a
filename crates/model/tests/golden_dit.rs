//! The transformer against diffusers 0.42.1 `WanTransformer3DModel`: fixtures made by
//! `tools/make_dit_fixtures.py` (tiny configs, seeded weights, inputs, outputs).

use std::path::PathBuf;

use headroom_model::WanTransformer;
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dit")
        .join(name)
}

#[test]
fn forward_matches_diffusers_with_and_without_text() {
    let dev = Device::cpu().unwrap();
    for name in ["t2v", "i2v36", "h2d16"] {
        let dir = fixture(name);
        let model = WanTransformer::load(&dir, &dev, DType::F32).unwrap();
        let x = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let t = read_npy(dir.join("timestep.npy"), &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0];
        let text = read_npy(dir.join("text.npy"), &dev).unwrap();
        for (with_text, file) in [(true, "out_text.npy"), (false, "out_notext.npy")] {
            let expected = read_npy(dir.join(file), &dev).unwrap();
            let got = model
                .forward(&x, t, with_text.then_some(&text), None)
                .unwrap();
            assert_eq!(got.shape(), expected.shape());
            let (g, e) = (
                got.to_vec::<f32>().unwrap(),
                expected.to_vec::<f32>().unwrap(),
            );
            let scale = e.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = g
                .iter()
                .zip(&e)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            println!("{name} text={with_text}: max abs error {err:e} (output scale {scale})");
            assert!(
                err <= 1e-4 * scale.max(1.0),
                "{name} text={with_text}: {err}"
            );
        }
    }
}
