// Command loadgen is the compiled load generator of benchmarks/lifecycle.py: a closed loop of a
// fixed number of connections, each sending one POST at a time over a kept-alive HTTP/1.1
// connection, so the client is never the bottleneck the Python client can be.
//
// Every request gets its own body: the template's "{i}" is replaced by the request's index
// (warm-up requests come first, then the measured ones), so each request carries a unique
// idempotency key. A header value may carry "{i}" too (e.g. an Idempotency-Key header for a
// provider driven directly), replaced the same way. The result is one JSON object on stdout: requests, elapsed seconds,
// requests per second, p50/p90/p99/max latency in milliseconds, and the count of answers whose
// status was not the expected one (and of transport errors), by status. The first unexpected
// answer is printed on stderr.
//
// Standard library only; benchmarks/lifecycle.py builds it on demand into a cache directory.
//
//	loadgen -url http://127.0.0.1:PORT/v1/actions -requests 1000 -concurrency 16 \
//	    -body '{"idempotency_key":"k-{i}", ...}' -header 'Authorization: Bearer ...'
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type headers []string

func (h *headers) String() string { return strings.Join(*h, ", ") }

func (h *headers) Set(value string) error {
	if !strings.Contains(value, ":") {
		return errors.New("a header is 'Name: value'")
	}
	*h = append(*h, value)
	return nil
}

type result struct {
	Requests    int            `json:"requests"`
	Concurrency int            `json:"concurrency"`
	Elapsed     float64        `json:"elapsed_seconds"`
	RPS         float64        `json:"rps"`
	P50         float64        `json:"p50_ms"`
	P90         float64        `json:"p90_ms"`
	P99         float64        `json:"p99_ms"`
	Max         float64        `json:"max_ms"`
	Unexpected  int            `json:"unexpected"`
	ByStatus    map[string]int `json:"by_status"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	index := int(float64(len(sorted))*p+0.5) - 1
	if index < 0 {
		index = 0
	}
	if index >= len(sorted) {
		index = len(sorted) - 1
	}
	return float64(sorted[index].Microseconds()) / 1000
}

type run struct {
	client   *http.Client
	url      string
	template []string
	headers  http.Header
	// headers whose value carries "{i}": the value split around it, as the body's template
	templated map[string][]string
	expect    int
	reported  atomic.Bool
	next      atomic.Int64
	limit     int64
}

// one sends request number i and returns its latency and status ("error" for a transport error).
func (r *run) one(i int64) (time.Duration, string) {
	body := strings.Join(r.template, strconv.FormatInt(i, 10))
	request, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(body))
	if err != nil {
		return 0, "error"
	}
	request.Header = r.headers.Clone()
	for name, value := range r.templated {
		request.Header.Set(name, strings.Join(value, strconv.FormatInt(i, 10)))
	}
	request.ContentLength = int64(len(body))
	started := time.Now()
	response, err := r.client.Do(request)
	if err != nil {
		return time.Since(started), "error"
	}
	answer, err := io.ReadAll(response.Body)
	response.Body.Close()
	elapsed := time.Since(started)
	if err != nil {
		return elapsed, "error"
	}
	if response.StatusCode != r.expect && r.reported.CompareAndSwap(false, true) {
		// The first unexpected answer, once, so a misconfigured run says why.
		fmt.Fprintf(os.Stderr, "loadgen: request %d: status %d: %.300s\n", i, response.StatusCode, answer)
	}
	return elapsed, strconv.Itoa(response.StatusCode)
}

// phase runs requests [first, first+count) on concurrency loops and gathers their latencies.
func (r *run) phase(first int64, count int, concurrency int) ([]time.Duration, map[string]int, time.Duration) {
	r.next.Store(first)
	r.limit = first + int64(count)
	latencies := make([][]time.Duration, concurrency)
	statuses := make([]map[string]int, concurrency)
	var wg sync.WaitGroup
	started := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			own := make([]time.Duration, 0, count/concurrency+1)
			seen := map[string]int{}
			for {
				i := r.next.Add(1) - 1
				if i >= r.limit {
					break
				}
				latency, status := r.one(i)
				own = append(own, latency)
				seen[status]++
			}
			latencies[w], statuses[w] = own, seen
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(started)
	all := make([]time.Duration, 0, count)
	byStatus := map[string]int{}
	for w := 0; w < concurrency; w++ {
		all = append(all, latencies[w]...)
		for status, n := range statuses[w] {
			byStatus[status] += n
		}
	}
	return all, byStatus, elapsed
}

func main() {
	var extra headers
	url := flag.String("url", "", "the URL to POST to (required)")
	requests := flag.Int("requests", 1000, "measured requests")
	warmup := flag.Int("warmup", 100, "requests sent before measuring (not counted)")
	concurrency := flag.Int("concurrency", 16, "connections, each with one request in flight")
	body := flag.String("body", "{}", "the JSON body; each \"{i}\" is replaced by the request's index")
	expect := flag.Int("expect", 200, "the status every answer should have")
	timeout := flag.Duration("timeout", 60*time.Second, "per-request timeout")
	flag.Var(&extra, "header", "a request header 'Name: value' (repeatable; \"{i}\" in the value as in -body)")
	flag.Parse()
	if *url == "" || *requests < 1 || *concurrency < 1 {
		fmt.Fprintln(os.Stderr, "loadgen: -url is required; -requests and -concurrency must be at least 1")
		flag.Usage()
		os.Exit(2)
	}
	parts := strings.Split(*body, "{i}")
	header := http.Header{"Content-Type": {"application/json"}}
	templated := map[string][]string{}
	for _, h := range extra {
		name, value, _ := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if strings.Contains(value, "{i}") {
			templated[name] = strings.Split(value, "{i}")
		} else {
			header.Set(name, value)
		}
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        *concurrency,
		MaxIdleConnsPerHost: *concurrency,
		MaxConnsPerHost:     *concurrency,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	r := &run{
		client:    &http.Client{Transport: transport, Timeout: *timeout},
		url:       *url,
		template:  parts,
		headers:   header,
		templated: templated,
		expect:    *expect,
	}
	if *warmup > 0 {
		r.phase(0, *warmup, *concurrency)
	}
	latencies, byStatus, elapsed := r.phase(int64(*warmup), *requests, *concurrency)
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	unexpected := 0
	for status, n := range byStatus {
		if status != strconv.Itoa(*expect) {
			unexpected += n
		}
	}
	out := result{
		Requests:    len(latencies),
		Concurrency: *concurrency,
		Elapsed:     elapsed.Seconds(),
		RPS:         float64(len(latencies)) / elapsed.Seconds(),
		P50:         percentile(latencies, 0.50),
		P90:         percentile(latencies, 0.90),
		P99:         percentile(latencies, 0.99),
		Max:         percentile(latencies, 1.0),
		Unexpected:  unexpected,
		ByStatus:    byStatus,
	}
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	if err := encoder.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	os.Stdout.Write(buffer.Bytes())
}
