//! What the text encoder holds: on-demand weights released at `text_end`, resident
//! weights kept, and the embedding cache's byte budget and LRU order.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use headroom_mem::{AllocatorConfig, CachingPlatform, Phase, Platform, ReclaimPolicy};
use headroom_tensor::{DType, Device, Tensor};
use headroom_text::{EmbeddingCache, TextEncoder, TextEncoderMode};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn cpu(reclaim: ReclaimPolicy) -> (Arc<dyn Platform>, Device) {
    let platform: Arc<dyn Platform> =
        Arc::new(CachingPlatform::cpu(None, AllocatorConfig::default(), reclaim).unwrap());
    platform.allocator().set_history(10_000);
    let device = Device::new(Arc::clone(&platform));
    (platform, device)
}

fn reserved(platform: &Arc<dyn Platform>) -> i64 {
    platform.memory_stats().reserved_bytes.all().current
}

fn encoder(device: &Device, mode: TextEncoderMode, budget: u64) -> TextEncoder {
    TextEncoder::load(&fixtures(), device, DType::F32, mode, budget)
        .unwrap()
        .with_max_length(16)
        .unwrap()
}

#[test]
fn on_demand_text_phase_leaves_only_the_embedding_reserved() {
    let (platform, device) = cpu(ReclaimPolicy::Always);
    let encoder = encoder(&device, TextEncoderMode::OnDemand, 0);
    assert_eq!(encoder.report().resident_weight_bytes, 0);
    let before = reserved(&platform);

    // The engine's schedule crosses `text_end` where the encoder released its weights.
    let text_end = || {
        platform.phase(Phase::TextEnd);
    };
    let embeds = encoder
        .encode_with("a cat runs across the green grass", &text_end)
        .unwrap();
    let after = reserved(&platform);
    let report = encoder.report();
    assert_eq!(report.loads, 1);
    assert_eq!(
        report.resident_weight_bytes, 0,
        "weights released after the prompt"
    );
    assert!(
        platform.memory_stats().reserved_bytes.all().peak - before >= report.weight_bytes as i64,
        "the weights were on the device during the phase"
    );
    let trace = platform.allocator().trace();
    assert!(trace
        .iter()
        .any(|e| e.name.as_deref() == Some(Phase::TextEnd.name())));

    // The embedding is all the phase left: dropping it returns reserved memory to what
    // it was before, and a tensor of its shape alone reserves exactly the difference.
    drop(embeds);
    platform.phase(Phase::SessionEnd);
    assert_eq!(reserved(&platform), before);
    let alone = Tensor::zeros(&[16, 32], DType::F32, &device).unwrap();
    assert_eq!(reserved(&platform) - before, after - before);
    drop(alone);
}

#[test]
fn resident_weights_stay_between_prompts() {
    let (platform, device) = cpu(ReclaimPolicy::Always);
    let encoder = encoder(&device, TextEncoderMode::Resident, 0);
    let weights = encoder.report().resident_weight_bytes;
    assert!(weights > 0);
    let first = encoder.encode("a dog").unwrap();
    let second = encoder.encode("a dog").unwrap();
    drop((first, second));
    platform.phase(Phase::SessionEnd);
    let report = encoder.report();
    assert_eq!((report.loads, report.encodes), (1, 2));
    assert_eq!(report.resident_weight_bytes, weights);
    assert!(reserved(&platform) >= weights as i64);
}

#[test]
fn on_demand_and_resident_embeddings_are_identical() {
    let device = Device::cpu().unwrap();
    let on_demand = encoder(&device, TextEncoderMode::OnDemand, 0);
    let resident = encoder(&device, TextEncoderMode::Resident, 0);
    let prompt = "snow falls on the quiet village";
    assert_eq!(
        on_demand.encode(prompt).unwrap().to_f32_vec().unwrap(),
        resident.encode(prompt).unwrap().to_f32_vec().unwrap()
    );
}

#[test]
fn cache_evicts_the_least_recently_used_prompt_by_bytes() {
    let device = Device::cpu().unwrap();
    let one = Tensor::zeros(&[16, 32], DType::F32, &device)
        .unwrap()
        .storage_bytes() as u64;
    let encoder = encoder(&device, TextEncoderMode::OnDemand, 2 * one);
    let encode = |p: &str| encoder.encode(p).unwrap();
    let a = encode("a cat");
    encode("a dog");
    // Cleaned prompts share an entry: surplus whitespace is no new prompt.
    let again = encode("  a   cat ");
    assert!(
        again.shares_storage(&a),
        "a hit hands out the cached embedding"
    );
    encode("a bird"); // evicts "a dog", the least recently used
    encode("a dog"); // miss; evicts "a cat"
    encode("a bird"); // hit
    let report = encoder.report();
    assert_eq!((report.cache_hits, report.cache_misses), (2, 4));
    assert_eq!(report.cache_entries, 2);
    assert_eq!(report.cache_bytes, 2 * one);
    assert_eq!(report.loads, 4, "hits load no weights");
}

#[test]
fn embeddings_larger_than_the_budget_are_not_cached() {
    let device = Device::cpu().unwrap();
    let small = Tensor::zeros(&[4], DType::F32, &device).unwrap();
    let large = Tensor::zeros(&[1024], DType::F32, &device).unwrap();
    let mut cache = EmbeddingCache::new(large.storage_bytes() as u64 - 1);
    cache.insert("large", &large);
    assert!(!cache.contains("large"));
    cache.insert("small", &small);
    assert!(cache.get("small").is_some());
    assert_eq!(cache.stats().bytes, small.storage_bytes() as u64);
    let mut off = EmbeddingCache::new(0);
    off.insert("small", &small);
    assert!(off.get("small").is_none());
    assert_eq!((off.stats().hits, off.stats().misses), (0, 1));
}

#[test]
fn umt5_xxl_holds_about_11_gb_of_bf16_weights_on_a_modelled_device() {
    use headroom_text::{TextTokenizer, Umt5Config};
    let (platform, device) = {
        let platform: Arc<dyn Platform> = Arc::new(
            CachingPlatform::sim(64 << 30, AllocatorConfig::default(), ReclaimPolicy::Always)
                .unwrap(),
        );
        let device = Device::new(Arc::clone(&platform));
        (platform, device)
    };
    let tokenizer = TextTokenizer::from_dir(&fixtures().join("tokenizer"), 512).unwrap();
    let encoder = TextEncoder::seeded(
        Umt5Config::umt5_xxl(),
        0,
        tokenizer,
        &device,
        DType::BF16,
        TextEncoderMode::OnDemand,
        0,
    )
    .unwrap();
    let embeds = encoder.encode("a cat").unwrap();
    assert_eq!(embeds.shape(), [512, 4096]);
    let report = encoder.report();
    // 5.68 B parameters in bf16.
    assert!(
        (11_000_000_000..11_800_000_000).contains(&report.weight_bytes),
        "{}",
        report.weight_bytes
    );
    assert_eq!(report.resident_weight_bytes, 0);
    let stats = platform.memory_stats();
    assert!(stats.reserved_bytes.all().peak as u64 >= report.weight_bytes);
    drop(embeds);
    platform.phase(Phase::SessionEnd);
    assert_eq!(platform.memory_stats().reserved_bytes.all().current, 0);
}
