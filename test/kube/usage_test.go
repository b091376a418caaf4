package kube

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// cpuTime is the CPU time (user and system) the process has used so far; 0 when it
// does not run.
func (p *proc) cpuTime() time.Duration {
	if p == nil || p.cmd == nil || !p.Running() {
		return 0
	}
	return pidCPU(p.cmd.Process.Pid)
}

// pidCPU is the CPU time process pid has used so far.
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name (in parentheses, which may hold spaces):
	// utime and stime are the 12th and 13th, in clock ticks of 1/100 s.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond
}

// usage samples the CPU time of a side's processes, to tell how much of the machine
// each used in a run.
type usage struct {
	procs      []*proc
	start      []time.Duration
	self       time.Duration // this process's: the test and the etcd it embeds
	busy, idle int64         // the machine's, in clock ticks
	at         time.Time
}

func startUsage(procs ...*proc) *usage {
	u := &usage{procs: procs, at: time.Now(), self: pidCPU(os.Getpid())}
	u.busy, u.idle = machineTicks()
	for _, p := range procs {
		u.start = append(u.start, p.cpuTime())
	}
	return u
}

// String is the CPU time each process used since startUsage, the wall time, and how
// busy the machine's processors were (every process on it, other users' too).
func (u *usage) String() string {
	var parts []string
	for i, p := range u.procs {
		parts = append(parts, fmt.Sprintf("%s %.1fs", p.name, (p.cpuTime()-u.start[i]).Seconds()))
	}
	parts = append(parts, fmt.Sprintf("test+etcd %.1fs", (pidCPU(os.Getpid())-u.self).Seconds()))
	busy, idle := machineTicks()
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("CPU in %.0fs: %s; machine %.0f%% busy, load %s", time.Since(u.at).Seconds(),
		strings.Join(parts, ", "), 100*float64(busy-u.busy)/float64(max(1, busy-u.busy+idle-u.idle)),
		strings.Join(strings.Fields(string(load))[:3], " "))
}

// machineTicks are the clock ticks all processors spent busy and idle (iowait counted
// idle) since boot.
func machineTicks() (busy, idle int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		if i == 3 || i == 4 {
			idle += v
		} else if i < 8 {
			busy += v
		}
	}
	return busy, idle
}

// scrape reads a Prometheus text endpoint into series → value (none when unreachable).
func scrape(url string) map[string]float64 {
	resp, err := http.Get(url)
	if err != nil {
		return map[string]float64{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return map[string]float64{}
	}
	return parseMetrics(string(body))
}

// metricsDelta sums series with prefix in after, less before, by the rest of their
// name.
func metricsDelta(before, after map[string]float64, prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if strings.HasPrefix(k, prefix) {
			out[strings.TrimPrefix(k, prefix)] += v - before[k]
		}
	}
	return out
}
