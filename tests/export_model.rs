//! `envace export-model` on a run folder of the tiny model with three checkpoint records: step 1
//! (eval_score 0.9) and step 2 (0.5) with their files, step 3 (0.95) whose file is gone, as the
//! daemon's pruning leaves them. The HF export of the newest checkpoint reads back through
//! envace's HF loader to the same logits; the f16 GGUF export of the best one reads back through
//! `GgufFile` within f16 rounding; a missing run, step or file fails naming what exists.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use envace::config::{Preset, RunConfig};
use envace::kernels::gguf::GgufFile;
use envace::kernels::hf::load_checkpoint;
use envace::kernels::{load, Model, ModelConfig, ModelSource, Tokenizer};
use envace::storage::{Checkpoint, Store, StoreOptions};
use tch::{Device, Kind, Tensor};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path =
            std::env::temp_dir().join(format!("envace-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn envace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Next-token logits `[2, 7, vocab]` of two fixed rows of ids.
fn logits(model: &Model) -> Tensor {
    let ids: Vec<i64> = (0..14).map(|i| (i * 3001 + 17) % 49152).collect();
    let input = Tensor::from_slice(&ids).view([2, 7]);
    tch::no_grad(|| model.logits(&model.forward_hidden(&input)))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Waits until sled's background threads let go of the database (dropping the last `Store`
/// does not release its lock at once).
fn wait_closed(db: &Path) {
    let file = std::fs::File::open(db.join("db")).unwrap();
    let start = Instant::now();
    while file.try_lock().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "sled kept the db"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    file.unlock().unwrap();
}

/// A run folder: the tiny preset's config.toml, checkpoint files of steps 1 and 2 (the tiny
/// model with every parameter moved by noise of σ 0.01, differently per step) and records of
/// steps 1, 2 and 3. Returns the folder and the two perturbed models; `None` without the
/// embedded GGUF (the tiny model's tokenizer).
fn run_folder(tag: &str) -> Option<(TempDir, Model, Model)> {
    let gguf = envace::kernels::loader::embedded_gguf_path();
    if !gguf.exists() {
        println!("skipping: {} not found (run `make setup`)", gguf.display());
        return None;
    }
    let dir = TempDir::new(tag);
    std::fs::write(
        dir.0.join("config.toml"),
        RunConfig::preset(Preset::Tiny).to_toml(),
    )
    .unwrap();
    let mut models = Vec::new();
    let mut records = Vec::new();
    for (step, score) in [(1u64, 0.9), (2, 0.5), (3, 0.95)] {
        let path = format!("checkpoints/envace-step{step}.safetensors");
        records.push(Checkpoint {
            run: "envace".into(),
            step,
            path: PathBuf::from(&path),
            metrics: [("eval_score".to_string(), score), ("loss".to_string(), 0.1)].into(),
        });
        if step == 3 {
            continue;
        }
        let model = load(&ModelSource::Tiny, Device::Cpu, Kind::Float)
            .unwrap()
            .model;
        tch::manual_seed(step as i64);
        tch::no_grad(|| {
            for (_, mut var) in model.var_store().variables() {
                var += var.randn_like() * 0.01;
            }
        });
        model.save_weights(&dir.0.join(&path)).unwrap();
        models.push(model);
    }
    let store = Store::open(dir.0.join("db"), StoreOptions::default()).unwrap();
    store.put_many(&records).unwrap();
    drop(store);
    wait_closed(&dir.0.join("db"));
    let step2 = models.pop().unwrap();
    let step1 = models.pop().unwrap();
    Some((dir, step1, step2))
}

#[test]
fn exports_read_back_through_envaces_loaders() {
    let Some((dir, step1, step2)) = run_folder("read-back") else {
        return;
    };
    let run = dir.0.to_str().unwrap();
    let untrained = load(&ModelSource::Tiny, Device::Cpu, Kind::Float).unwrap();

    // Default: the newest checkpoint whose file exists (step 2; step 3's file is gone), f32.
    let hf = dir.0.join("hf");
    let out = envace(&[
        "export-model",
        "--run",
        run,
        "--format",
        "hf",
        "--out",
        hf.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{}{}", stdout, text(&out.stderr));
    assert!(stdout.contains("exported step 2 "), "{stdout}");
    assert!(stdout.contains("model.safetensors"), "{stdout}");
    let (config, weights) = load_checkpoint(&hf).unwrap();
    assert_eq!(config, ModelConfig::tiny());
    let exported = Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap();
    let want = logits(&step2);
    let diff = max_abs_diff(&want, &logits(&exported));
    assert!(diff <= 1e-5, "hf f32 logits differ by {diff}");
    // The trained weights, not the base model's.
    let moved = max_abs_diff(&want, &logits(&untrained.model));
    assert!(
        moved > 1e-3,
        "the checkpoint barely moved the logits: {moved}"
    );
    // The tokenizer files give the same tokens, special ids and chat template.
    let tokenizer = Tokenizer::from_file(hf.join("tokenizer.json")).unwrap();
    let original = &untrained.tokenizer;
    let sample = "<|im_start|>user\nCall get_weather(city=\"Paris\") 42 times<|im_end|>\n";
    assert_eq!(
        tokenizer.encode(sample).unwrap(),
        original.encode(sample).unwrap()
    );
    assert_eq!(tokenizer.eos_token_ids, original.eos_token_ids);
    assert_eq!(tokenizer.bos_token_id, original.bos_token_id);
    assert_eq!(tokenizer.chat_template, original.chat_template);
    assert!(tokenizer.chat_template.is_some());

    // --best: the highest eval_score with a file (step 1, 0.9; step 3's 0.95 is gone), as f16.
    let gguf = dir.0.join("best-f16.gguf");
    let out = envace(&[
        "export-model",
        "--run",
        run,
        "--best",
        "--format",
        "gguf",
        "--dtype",
        "f16",
        "--out",
        gguf.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{}{}", stdout, text(&out.stderr));
    assert!(
        stdout.contains("exported step 1 ") && stdout.contains("eval_score 0.9"),
        "{stdout}"
    );
    let f = GgufFile::open(&gguf).unwrap();
    let config = f.model_config().unwrap();
    assert_eq!(config, ModelConfig::tiny());
    assert_eq!(f.metadata()["general.file_type"].as_u64(), Some(1));
    assert_eq!(f.tensor_info("blk.0.attn_q.weight").unwrap().kind, 1);
    assert_eq!(f.tensor_info("blk.0.attn_norm.weight").unwrap().kind, 0);
    let exported = Model::from_weights(
        &config,
        f.load_weights(&config).unwrap(),
        Device::Cpu,
        Kind::Float,
    )
    .unwrap();
    let want = logits(&step1);
    let got = logits(&exported);
    let relative = max_abs_diff(&want, &got) / want.abs().max().double_value(&[]);
    println!("gguf f16: relative logit error {relative:.3e}");
    assert!(
        relative < 2e-3,
        "gguf f16 logits differ by {relative} (relative)"
    );
    assert!(
        max_abs_diff(&want, &logits(&step2)) > 1e-3,
        "steps 1 and 2 differ"
    );
    // The GGUF carries the tokenizer: it tokenizes as the source does.
    let tokenizer = Tokenizer::from_gguf_metadata(f.metadata()).unwrap();
    assert_eq!(
        tokenizer.encode(sample).unwrap(),
        original.encode(sample).unwrap()
    );
}

#[test]
fn missing_run_step_or_file_fails_naming_what_exists() {
    let Some((dir, _, _)) = run_folder("errors") else {
        return;
    };
    let run = dir.0.to_str().unwrap();
    let out_dir = dir.0.join("out");
    let out = out_dir.to_str().unwrap();
    let fails = |args: &[&str]| {
        let o = envace(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let stderr = text(&o.stderr);
        println!("{stderr}");
        stderr
    };

    let msg = fails(&[
        "export-model",
        "--run",
        run,
        "--step",
        "99",
        "--format",
        "hf",
        "--out",
        out,
    ]);
    assert!(
        msg.contains("no checkpoint of step 99")
            && msg.contains("checkpoints (steps): 1 eval_score 0.9, 2 eval_score 0.5")
            && !msg.contains("0.95"),
        "{msg}"
    );
    let msg = fails(&[
        "export-model",
        "--run",
        run,
        "--step",
        "3",
        "--format",
        "hf",
        "--out",
        out,
    ]);
    assert!(
        msg.contains("step 3") && msg.contains("envace-step3.safetensors is gone"),
        "{msg}"
    );
    let missing = dir.0.join("no-such-run");
    let msg = fails(&[
        "export-model",
        "--run",
        missing.to_str().unwrap(),
        "--format",
        "hf",
        "--out",
        out,
    ]);
    assert!(
        msg.contains("no-such-run is not a run folder: it has no config.toml"),
        "{msg}"
    );
    // A folder as the GGUF output is refused before anything is loaded.
    std::fs::create_dir_all(&out_dir).unwrap();
    let msg = fails(&[
        "export-model",
        "--run",
        run,
        "--format",
        "gguf",
        "--out",
        out,
    ]);
    assert!(msg.contains("writes one file"), "{msg}");
    // Nothing was written by the failed exports.
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
}
