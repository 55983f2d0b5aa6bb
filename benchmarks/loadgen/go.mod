module agentsafe.invalid/benchmarks/loadgen

go 1.22
