// Prints `ns<TAB>{:?}` for std::time::Duration values, as TGI's router records its request
// timings (`span.record("total_time", format!("{total_time:?}"))`), and TGI's
// time_per_token (inference_time / generated_tokens). Regenerate the .tsv beside it with
//     RUSTC_VERSION="$(rustc --version | cut -d" " -f2)" rustc -O rust_duration_debug.rs
//     ./rust_duration_debug > rust_duration_debug.tsv
// Written for inferpath's tests (same license as the repository).
use std::time::Duration;

fn main() {
    println!("# rustc {}: std's impl Debug for Duration; written by rust_duration_debug.rs", env!("RUSTC_VERSION"));
    let nanos: [u64; 16] = [0, 1, 999, 1_000, 1_500, 999_999, 1_000_000, 1_234_567, 12_300_000, 999_999_999,
                            1_000_000_000, 1_500_000_000, 61_000_000_001, 40_123_456, 80_000, 3_600_000_000_000];
    for n in nanos.iter() {
        println!("{}\t{:?}", n, Duration::from_nanos(*n));
    }
    let inference = Duration::from_nanos(1_234_567_891);
    for tokens in [1u32, 3, 7, 100, 2048].iter() {
        let per_token = inference / *tokens;
        println!("{}\t{:?}", per_token.as_nanos(), per_token);
    }
}
