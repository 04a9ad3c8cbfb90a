//! `headroom generate --noise … --dump-latents …` through the real binary, on the
//! reference-rollout fixtures of `crates/engine/tests/fixtures/rollout/`
//! (`tools/reference_rollout.py`).

mod common;
use common::headroom;

use std::path::{Path, PathBuf};

use headroom_tensor::io::npy::read_npy;
use headroom_tensor::Device;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/rollout")
        .join(name)
}

/// `headroom generate` on fixture model `name` at its 64×48, 8-chunk scenario.
fn generate(name: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let model = fixture(name);
    let text = model.join("text_a.npy");
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().expect("UTF-8 paths"),
        "--width",
        "64",
        "--height",
        "48",
        "--frames",
        "93",
        "--text-embeds",
        text.to_str().expect("UTF-8 paths"),
        "--out",
        out.to_str().expect("UTF-8 paths"),
    ];
    args.extend_from_slice(extra);
    headroom(&args)
}

#[test]
fn generate_with_reference_noise_dumps_the_reference_rollouts_latents() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("latents.npy");
    let noise = fixture("t2v_cam").join("noise.npy");
    let res = generate(
        "t2v_cam",
        &dir.path().join("v.y4m"),
        &[
            "--actions",
            "wwwddlliii-jjwwssaakkkld",
            "--noise",
            noise.to_str().unwrap(),
            "--dump-latents",
            dump.to_str().unwrap(),
        ],
    );
    common::assert_ok(&res);
    let host = Device::cpu().unwrap();
    let got = read_npy(&dump, &host).unwrap();
    let want = read_npy(fixture("t2v_cam").join("latents.npy"), &host).unwrap();
    assert_eq!(got.shape(), [8, 16, 3, 6, 8]);
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    for (b, (gb, wb)) in g.chunks(g.len() / 8).zip(w.chunks(w.len() / 8)).enumerate() {
        let scale = wb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = gb
            .iter()
            .zip(wb)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-4 * scale, "block {b}: {err} of {scale}");
    }
}

#[test]
fn an_image_conditioned_camera_run_takes_supplied_noise_and_refuses_a_wrong_shape() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("first.png");
    image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 5) as u8, 90])
    })
    .save(&image)
    .unwrap();
    let noise = fixture("i2v_cam").join("noise.npy");
    let dump = |name: &str| dir.path().join(name);
    let run = |out: &str| {
        generate(
            "i2v_cam",
            &dir.path().join("v.y4m"),
            &[
                "--image",
                image.to_str().unwrap(),
                "--actions",
                "wwdd-jjll",
                "--noise",
                noise.to_str().unwrap(),
                "--dump-latents",
                dump(out).to_str().unwrap(),
                "--seed",
                if out == "a.npy" { "1" } else { "2" },
            ],
        )
    };
    common::assert_ok(&run("a.npy"));
    common::assert_ok(&run("b.npy"));
    let host = Device::cpu().unwrap();
    let a = read_npy(dump("a.npy"), &host).unwrap();
    assert_eq!(a.shape(), [8, 16, 3, 6, 8]);
    let b = read_npy(dump("b.npy"), &host).unwrap();
    assert_eq!(
        a.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        "supplied noise replaces the seeded generator"
    );

    // Noise for 2 blocks where the request needs 8: refused before any output.
    let short = dir.path().join("short.npy");
    let t = read_npy(&noise, &host).unwrap().narrow(0, 0, 2).unwrap();
    headroom_tensor::io::npy::write_npy(&short, &t).unwrap();
    let out = dir.path().join("refused.y4m");
    let res = generate(
        "i2v_cam",
        &out,
        &[
            "--noise",
            short.to_str().unwrap(),
            "--dump-latents",
            dump("c.npy").to_str().unwrap(),
        ],
    );
    assert!(!res.status.success());
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        stderr.contains("noise") && stderr.contains("[8, 4, 16, 3, 6, 8]"),
        "{stderr}"
    );
    assert!(!out.exists() && !dump("c.npy").exists());
}
