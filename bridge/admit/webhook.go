package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Webhook is the mutating admission webhook of Services: an http.Handler of
// AdmissionReview (admission.k8s.io/v1) requests. It keeps no state of its own (every
// decision is allocd's and the cluster's), so that several replicas serve behind one
// Service.
type Webhook struct {
	log     *slog.Logger
	allocd  Allocd
	cluster *Cluster
	m       *metrics
	// maxTime bounds an answer when kube-apiserver sends no timeout.
	maxTime time.Duration
	health  atomic.Pointer[allocdHealth]
}

// DefaultMaxTime is how long an admission may take when kube-apiserver's request names
// no timeout: kube-apiserver's default timeoutSeconds.
const DefaultMaxTime = 10 * time.Second

// maxBody bounds an AdmissionReview's size (kube-apiserver's own request limit is
// 3 MiB; a Service and its old object fit well within it).
const maxBody = 7 << 20

// New returns a Webhook that allocates in a and checks against cluster, with its
// metrics on reg.
func New(log *slog.Logger, a Allocd, cluster *Cluster, reg prometheus.Registerer) (*Webhook, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Webhook{log: log, allocd: a, cluster: cluster, m: m, maxTime: DefaultMaxTime}, nil
}

// SetMaxTime sets how long an admission may take when kube-apiserver's request names
// no timeout (DefaultMaxTime unless set), and caps the time it names.
func (w *Webhook) SetMaxTime(d time.Duration) {
	if d > 0 {
		w.maxTime = d
	}
}

// Ready reports whether the webhook can serve: its informers of the cluster synced.
// allocd's reachability is not part of it: a replica that left its Service's
// endpoints while allocd is down would make kube-apiserver's error under failurePolicy
// Fail a connection refused instead of the webhook's answer, which names allocd and
// its last health check.
func (w *Webhook) Ready() error {
	if !w.cluster.Synced() {
		return ErrNotSynced
	}
	return nil
}

// allocdHealth is what WatchAllocd last saw of allocd.
type allocdHealth struct {
	err   error // nil: serving
	since time.Time
}

// WatchAllocd calls health now and every interval until ctx ends, and keeps what it
// answered for the webhook's errors (an admission allocd could not serve names
// allocd's last health check) and the allocd_webhook_allocd_reachable gauge.
func (w *Webhook) WatchAllocd(ctx context.Context, health func(context.Context) error,
	interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		hctx, cancel := context.WithTimeout(ctx, interval)
		err := health(hctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		prev := w.health.Load()
		if prev == nil || (prev.err == nil) != (err == nil) {
			w.log.Info("allocd reachability changed", "reachable", err == nil, "error", err)
			w.health.Store(&allocdHealth{err: err, since: time.Now()})
		} else if err != nil {
			w.health.Store(&allocdHealth{err: err, since: prev.since})
		}
		if err == nil {
			w.m.allocdUp.Set(1)
		} else {
			w.m.allocdUp.Set(0)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// allocdState says what the last health check of allocd answered, for an error.
func (w *Webhook) allocdState() string {
	h := w.health.Load()
	switch {
	case h == nil:
		return "allocd's health not checked yet"
	case h.err == nil:
		return "allocd's health check passes"
	}
	return fmt.Sprintf("allocd's health check failing since %s: %v", h.since.UTC().Format(time.RFC3339),
		h.err)
}

// ServeHTTP answers one AdmissionReview. A request the webhook cannot serve (allocd
// unreachable) is answered with HTTP 500 and a Status naming allocd, so that the
// webhook's failurePolicy decides: Ignore lets kube-apiserver allocate by itself, Fail
// refuses the request with that message.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	var review admissionv1.AdmissionReview
	err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&review)
	if err != nil || review.Request == nil {
		w.fail(rw, "", start, http.StatusBadRequest, fmt.Errorf("undecodable AdmissionReview: %v", err))
		return
	}
	req := review.Request
	budget, ok := w.budget(r)
	if !ok {
		w.log.Warn("admission not served: kube-apiserver's deadline leaves no time to allocate; the "+
			"webhook's failure policy decides", "operation", req.Operation, "namespace", req.Namespace,
			"name", req.Name, "uid", req.UID, "timeout", r.URL.Query().Get("timeout"))
		w.fail(rw, string(req.Operation), start, http.StatusInternalServerError, fmt.Errorf(
			"%w: not asked: kube-apiserver's deadline (timeout=%s) leaves no time to allocate before it",
			ErrAllocd, r.URL.Query().Get("timeout")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), budget)
	defer cancel()
	resp, result, err := w.Admit(ctx, req)
	if err != nil {
		w.log.Warn("admission not served; the webhook's failure policy decides", "operation", req.Operation,
			"namespace", req.Namespace, "name", req.Name, "uid", req.UID, "error", err)
		if errors.Is(err, ErrAllocd) || errors.Is(err, ErrDisagree) || errors.Is(err, ErrBehind) {
			err = fmt.Errorf("%w (%s)", err, w.allocdState())
		}
		w.fail(rw, string(req.Operation), start, http.StatusInternalServerError, err)
		return
	}
	review.Request, review.Response = nil, resp
	review.APIVersion, review.Kind = "admission.k8s.io/v1", "AdmissionReview"
	writeJSON(rw, http.StatusOK, &review)
	w.observe(string(req.Operation), result, start)
}

// budget is how long an admission may take: kube-apiserver sends its own deadline as
// the timeout parameter, rounded up to a whole second (what is left of it may be up
// to a second less); the webhook answers a second before it, so that nothing is
// allocated after kube-apiserver gave up. A timeout of a second or less leaves no such
// time: ok is false, and the webhook answers at once without asking allocd.
func (w *Webhook) budget(r *http.Request) (d time.Duration, ok bool) {
	d, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	if err != nil || d <= 0 {
		return w.maxTime, true
	}
	if d <= time.Second {
		return 0, false
	}
	return min(d-time.Second, w.maxTime), true
}

func (w *Webhook) observe(operation, result string, start time.Time) {
	switch operation {
	case string(admissionv1.Create), string(admissionv1.Update):
	default:
		operation = "other"
	}
	w.m.requests.WithLabelValues(operation, result).Inc()
	w.m.duration.WithLabelValues(operation).Observe(time.Since(start).Seconds())
}

// fail answers code with a Status whose message says why (an error of allocd's begins
// with "allocd: "); kube-apiserver shows it in its error under failurePolicy Fail.
func (w *Webhook) fail(rw http.ResponseWriter, operation string, start time.Time, code int, err error) {
	msg := "allocd-bridge webhook: " + err.Error()
	writeJSON(rw, code, &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status: metav1.StatusFailure, Code: int32(code), Message: msg})
	w.observe(operation, ResultError, start)
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_, _ = rw.Write(b)
}

var servicesResource = metav1.GroupVersionResource{Version: "v1", Resource: "services"}

// Admit decides one admission request: allowed as it is, allowed with a patch, or
// refused as kube-apiserver would refuse it (result says which). An error is a request
// the webhook could not serve.
func (w *Webhook) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) (
	resp *admissionv1.AdmissionResponse, result string, err error) {
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Resource != servicesResource || req.SubResource != "" ||
		req.Operation != admissionv1.Create && req.Operation != admissionv1.Update ||
		req.DryRun != nil && *req.DryRun {
		return allow, ResultAllowed, nil
	}
	var svc, old corev1.Service
	if err := json.Unmarshal(req.Object.Raw, &svc); err != nil {
		return nil, "", fmt.Errorf("undecodable Service: %w", err)
	}
	svc.Namespace = req.Namespace
	if svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes" ||
		svc.Spec.Type == corev1.ServiceTypeExternalName || headless(&svc) {
		return allow, ResultAllowed, nil
	}
	if !w.cluster.Synced() {
		// Without the cluster's IPAddresses and node ports, allocd's answers cannot be
		// checked against what kube-apiserver allocated by itself.
		return nil, "", ErrNotSynced
	}
	fs, ok := w.cluster.Families()
	if !ok {
		return nil, "", ErrNoFamilies
	}
	var n *need
	var self *allocdv1.Owner
	if req.Operation == admissionv1.Create {
		n, ok = fs.planCreate(&svc)
	} else {
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return nil, "", fmt.Errorf("undecodable old Service: %w", err)
		}
		old.Namespace = req.Namespace
		n, ok = fs.planUpdate(&svc, &old)
		self = ownerOf(&old)
	}
	if !ok || n.empty() {
		return allow, ResultAllowed, nil
	}
	owner := &allocdv1.Owner{Namespace: req.Namespace, Name: n.name, Uid: ProvisionalPrefix + string(req.UID)}
	a := &admission{w: w, n: n, self: self, owner: owner}
	return w.decide(ctx, a, &svc, allow)
}

// decide runs a and answers with its patch, or its refusal.
func (w *Webhook) decide(ctx context.Context, a *admission, svc *corev1.Service,
	allow *admissionv1.AdmissionResponse) (*admissionv1.AdmissionResponse, string, error) {
	err := a.run(ctx)
	var refusal *apierrors.StatusError
	switch {
	case errors.As(err, &refusal):
		a.release(ctx)
		w.log.Info("admission refused as kube-apiserver refuses it", "namespace", a.owner.Namespace,
			"name", a.owner.Name, "owner_uid", a.owner.Uid, "reason", refusal.ErrStatus.Message)
		return &admissionv1.AdmissionResponse{UID: allow.UID, Result: &refusal.ErrStatus}, ResultDenied, nil
	case err != nil:
		a.release(ctx)
		return nil, "", err
	}
	patch, err := encodePatch(a.n.patch(svc))
	if err != nil || patch == nil {
		return allow, ResultAllowed, err
	}
	pt := admissionv1.PatchTypeJSONPatch
	allow.Patch, allow.PatchType = patch, &pt
	w.log.Debug("admission patched", "namespace", a.owner.Namespace, "name", a.owner.Name,
		"owner_uid", a.owner.Uid, "patch", string(patch))
	return allow, ResultPatched, nil
}

// release frees what the provisional owner holds when the object will not carry it (a
// refusal, an error: the patch is not applied), within the admission's own deadline
// (the answer must not wait past it): what this misses, the bridge's sweeper frees
// after the grace.
func (a *admission) release(ctx context.Context) {
	if !a.wrote || ctx.Err() != nil {
		return
	}
	if _, err := a.w.allocd.Release(ctx, &allocdv1.ReleaseRequest{Owner: a.owner}); err != nil {
		a.w.log.Info("release of a refused admission's allocations failed; the sweeper frees them",
			"owner_uid", a.owner.Uid, "error", err)
	}
}
