// Roman numerals in Rust: built once per candidate, run once per case (an integer on stdin, a JSON string out).
use std::io::Read;

// EVOLVE-BLOCK-START
/// Only knows I, V and X, and no subtractive forms yet.
fn solve(mut n: u32) -> String {
    let mut out = String::new();
    for (value, letter) in [(10, "X"), (5, "V"), (1, "I")] {
        while n >= value {
            out.push_str(letter);
            n -= value;
        }
    }
    out
}
// EVOLVE-BLOCK-END

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read stdin");
    let n: u32 = input.trim().parse().expect("one integer on stdin");
    println!("{:?}", solve(n));
}
