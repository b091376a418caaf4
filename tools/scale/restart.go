package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// restartRun is `scale -restarts N -dir DIR`: the restarts of a store an earlier run
// kept in DIR (-keep), N rounds of: kill -9 → SERVING on the embedded etcd; etcd alone
// on the data directory (start to ready); with it running, a replica joining and its
// kill -9 → SERVING. Every allocd start writes its CPU profile, block profile and
// steps (daemon.Start's phases: etcd, space, services) to DIR/restarts/<round>-<kind>;
// with -restart-trace an execution trace too. It prints each start's steps: allocd's
// own part is what follows etcd's. With -restart-churn D, every kill -9 before a
// measured start comes after D of Allocate+Release cycles, as a replica killed under
// load is: the start then replays what the index's checkpoint is behind (the line says
// how many revisions, read just before the kill).
func restartRun(ctx context.Context, o options) error {
	o.rateDuration = o.restartChurn
	s, err := newStack(o.dir, o)
	if err != nil {
		return err
	}
	defer s.stop()
	out := filepath.Join(o.dir, "restarts")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	f := newFiller(o.clients)
	defer f.close()
	fmt.Printf("restarts of the store in %s (%s), profiles in %s\n", o.dir, mib(dirSize(s.data)), out)
	for round := range o.restarts {
		var line []string
		// A kill -9 before every measured start.
		if _, err := s.startAllocd(ctx, ""); err != nil {
			return err
		}
		lag, err := s.churnKill(ctx, f)
		if err != nil {
			return err
		}
		start := func(kind, etcdServers string) error {
			dir := filepath.Join(out, fmt.Sprintf("%d-%s", round, kind))
			behind := ""
			if etcdServers != "" {
				behind = ", " + s.checkpointLag(ctx)
			}
			// A start's steps are read once its phases.txt exists: not an earlier run's.
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			s.startDir = dir
			took, err := s.startAllocd(ctx, etcdServers)
			s.startDir = ""
			if err != nil {
				return err
			}
			// SERVING comes a moment before serve writes the profiles and steps.
			for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(filepath.Join(dir, "phases.txt")); err == nil {
					break
				}
			}
			line = append(line, fmt.Sprintf("%s %s (%s%s%s)", kind, secs(took), readPhases(dir), behind, lag))
			lag = ""
			if kind == "join" {
				lag, err = s.churnKill(ctx, f)
				return err
			}
			s.killAllocd()
			return nil
		}
		if err := start("embedded", ""); err != nil {
			return err
		}
		etcdTook, err := s.startEtcd()
		if err != nil {
			return err
		}
		line = append(line, "etcd alone "+secs(etcdTook))
		time.Sleep(time.Second)
		ext := "http://" + s.etcdClient
		if err := start("join", ext); err != nil {
			return err
		}
		if err := start("external", ext); err != nil {
			return err
		}
		s.stopEtcd()
		fmt.Printf("round %d: %s\n", round, strings.Join(line, "; "))
	}
	return nil
}

// churnKill runs -restart-churn of Allocate+Release cycles on the allocd running and
// says how far behind its checkpoint then is; then it kills allocd with SIGKILL.
func (s *stack) churnKill(ctx context.Context, f *filler) (string, error) {
	defer s.killAllocd()
	if s.o.restartChurn <= 0 {
		return "", nil
	}
	if _, _, _, err := s.rateRun(ctx, f, -1); err != nil {
		return "", err
	}
	return ", killed with the " + s.checkpointLag(ctx), nil
}

// checkpointLag reads, from etcd alone, how many revisions the allocation index's
// checkpoint is behind etcd: what a start replays after reading it (etcd sends a watch
// that starts behind at most 1,000 revisions every 100 ms).
func (s *stack) checkpointLag(ctx context.Context) string {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + s.etcdClient},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err.Error()
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/allocd/checkpoints/head")
	if err != nil || len(resp.Kvs) == 0 {
		return fmt.Sprintf("no checkpoint head: %v", err)
	}
	var head struct {
		Rev int64 `json:"rev"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &head); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("checkpoint %d revisions behind", resp.Header.Revision-head.Rev)
}

// readPhases reads the steps a `scale serve` start wrote to dir: "etcd 1.234 s, ...".
func readPhases(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "phases.txt"))
	if err != nil {
		return "no phases: " + err.Error()
	}
	var parts []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, v, ok := strings.Cut(l, " ")
		if f, err := strconv.ParseFloat(v, 64); ok && err == nil {
			parts = append(parts, fmt.Sprintf("%s %.2f s", name, f))
		}
	}
	return strings.Join(parts, ", ")
}
