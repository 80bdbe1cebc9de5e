"""Side-by-side benchmarks (scripts, not tests). Outputs go to bench/out/ (git-ignored)."""
