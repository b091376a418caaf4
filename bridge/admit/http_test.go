package admit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
)

// post sends req to h as kube-apiserver does (timeout parameter included) and
// returns the HTTP status, the AdmissionReview or Status answered, and how long it took.
func post(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest, timeout string) (int,
	*admissionv1.AdmissionReview, *metav1.Status, time.Duration) {
	t.Helper()
	body := mustJSON(t, &admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{
		APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	srv := httptest.NewServer(h)
	defer srv.Close()
	start := time.Now()
	resp, err := http.Post(srv.URL+"/mutate?timeout="+timeout, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	took := time.Since(start)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var st metav1.Status
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatalf("answer %d %s: %v", resp.StatusCode, b, err)
		}
		return resp.StatusCode, nil, &st, took
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	return resp.StatusCode, &out, nil, took
}

func createRequest(t *testing.T, uid string, s spec) *admissionv1.AdmissionRequest {
	dry := false
	svc := s.object()
	return &admissionv1.AdmissionRequest{UID: types.UID("http-" + uid), Resource: servicesResource,
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
		Namespace: svc.Namespace, Name: svc.Name,
		Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: mustJSON(t, svc)}, DryRun: &dry}
}

// TestServeHTTP: an AdmissionReview in, the AdmissionReview out with the request's uid
// and a JSON Patch, counted by operation and result.
func TestServeHTTP(t *testing.T) {
	f := newFixture(t, setup{})
	req := createRequest(t, "1", spec{name: "web"})
	code, out, _, _ := post(t, f.w, req, "5s")
	if code != http.StatusOK || out.Response == nil || out.Response.UID != req.UID || !out.Response.Allowed ||
		out.Response.PatchType == nil || *out.Response.PatchType != admissionv1.PatchTypeJSONPatch ||
		out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Fatalf("answer %d %+v; want an AdmissionReview allowing with a JSON Patch", code, out)
	}
	if n := testutil.ToFloat64(f.w.m.requests.WithLabelValues("CREATE", ResultPatched)); n != 1 {
		t.Errorf("allocd_webhook_requests_total{CREATE,patched} = %v; want 1", n)
	}
	if n := testutil.CollectAndCount(f.w.m.duration); n != 1 {
		t.Errorf("allocd_webhook_request_duration_seconds series = %d; want 1", n)
	}
	code, _, st, _ := post(t, f.w, nil, "5s")
	if code != http.StatusBadRequest || st.Status != metav1.StatusFailure {
		t.Errorf("an empty review answered %d %+v; want 400 with a Status", code, st)
	}
}

// TestAllocdUnreachable: with allocd out of reach the webhook answers HTTP 500 with a
// Status that names allocd (kube-apiserver then follows the failurePolicy: Ignore lets
// the create through to its own allocator, Fail refuses it with this message), before
// kube-apiserver's timeout: a second before it, never after.
func TestAllocdUnreachable(t *testing.T) {
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = testCIDR4 })
	addr := d.GRPCAddr()
	d.Close() // nothing listens there any more
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := newFixture(t, setup{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := New(log, c, f.cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	code, _, st, took := post(t, w, createRequest(t, "2", spec{name: "web"}), "3s")
	if code != http.StatusInternalServerError || !strings.Contains(st.Message, "allocd") {
		t.Errorf("answer %d %+v; want 500 naming allocd", code, st)
	}
	if took < 1500*time.Millisecond || took > 2500*time.Millisecond {
		t.Errorf("answered after %v with timeout=3s; want about 2 s (the client retries until the budget "+
			"ends)", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	health := func(ctx context.Context) error {
		_, err := c.Health(ctx)
		return err
	}
	go func() { defer close(done); w.WatchAllocd(ctx, health, 50*time.Millisecond) }()
	waitFor(t, "allocd checked", func() bool { return w.health.Load() != nil })
	if err := w.Ready(); err != nil {
		t.Errorf("Ready() = %v with allocd down; want ready: a replica that left its Service's endpoints "+
			"would turn kube-apiserver's error under Fail into a connection refused", err)
	}
	if up := testutil.ToFloat64(w.m.allocdUp); up != 0 {
		t.Errorf("allocd_webhook_allocd_reachable = %v with allocd down; want 0", up)
	}
	code, _, st, _ = post(t, w, createRequest(t, "3", spec{name: "web3"}), "2s")
	if want := "allocd's health check failing since"; code != http.StatusInternalServerError ||
		!strings.Contains(st.Message, want) {
		t.Errorf("answer %d %+v; want 500 with %q", code, st, want)
	}
	cancel()
	<-done
}

// TestNoTimeToAllocate: kube-apiserver's timeout parameter is its deadline rounded up to
// a second; with timeout=1s what is left of it may be next to nothing, so the webhook
// answers at once (HTTP 500: the failure policy decides) and allocates nothing, rather
// than allocate after kube-apiserver gave up.
func TestNoTimeToAllocate(t *testing.T) {
	f := newFixture(t, setup{})
	req := createRequest(t, "4", spec{name: "web"})
	code, _, st, took := post(t, f.w, req, "1s")
	if code != http.StatusInternalServerError || !strings.Contains(st.Message, "allocd") {
		t.Errorf("answer %d %+v with timeout=1s; want 500 naming allocd", code, st)
	}
	if took > 500*time.Millisecond {
		t.Errorf("answered after %v with timeout=1s; want at once", took)
	}
	if held := f.held(ProvisionalPrefix + string(req.UID)); len(held) != 0 {
		t.Errorf("allocd holds %v for the admission; want nothing", held)
	}
	if code, out, _, _ := post(t, f.w, createRequest(t, "5", spec{name: "web2"}), "2s"); code != http.StatusOK ||
		!out.Response.Allowed {
		t.Errorf("answer %d %+v with timeout=2s; want allowed (a second to allocate in)", code, out)
	}
}

// TestNotSynced: before its informers synced the webhook cannot check allocd's answers
// against the cluster: it serves no admission (an error: the failure policy decides)
// and is not ready.
func TestNotSynced(t *testing.T) {
	kube := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(kube, 0)
	cluster, err := NewCluster(kube, factory) // never started
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	req := createRequest(t, "3", spec{name: "web"})
	if _, _, err := w.Admit(t.Context(), req); !errors.Is(err, ErrNotSynced) {
		t.Errorf("Admit() before the informers synced = %v; want ErrNotSynced", err)
	}
	if err := w.Ready(); !errors.Is(err, ErrNotSynced) {
		t.Errorf("Ready() = %v; want ErrNotSynced", err)
	}
}
