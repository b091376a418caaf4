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
	maxTime   time.Duration
	allocdUp  atomic.Bool
	allocdErr atomic.Pointer[error]
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

// Ready reports whether the webhook can decide: the cluster's informers synced, the
// cluster's families known, and allocd answering its health checks (WatchAllocd).
func (w *Webhook) Ready() error {
	if !w.cluster.Synced() {
		return ErrNotSynced
	}
	if _, ok := w.cluster.Families(); !ok {
		return ErrNoFamilies
	}
	if !w.allocdUp.Load() {
		if p := w.allocdErr.Load(); p != nil {
			return fmt.Errorf("allocd: %w", *p)
		}
		return errors.New("allocd: not checked yet")
	}
	return nil
}

// WatchAllocd calls health now and every interval until ctx ends, and keeps whether
// allocd answered for Ready.
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
		if err != nil {
			w.allocdErr.Store(&err)
		}
		if up := err == nil; w.allocdUp.Swap(up) != up {
			w.log.Info("allocd reachability changed", "reachable", up, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
	ctx, cancel := context.WithTimeout(r.Context(), w.budget(r))
	defer cancel()
	resp, result, err := w.Admit(ctx, req)
	if err != nil {
		w.log.Warn("admission not served; the webhook's failure policy decides", "operation", req.Operation,
			"namespace", req.Namespace, "name", req.Name, "uid", req.UID, "error", err)
		w.fail(rw, string(req.Operation), start, http.StatusInternalServerError, err)
		return
	}
	review.Request, review.Response = nil, resp
	review.APIVersion, review.Kind = "admission.k8s.io/v1", "AdmissionReview"
	writeJSON(rw, http.StatusOK, &review)
	w.observe(string(req.Operation), result, start)
}

// budget is how long an admission may take: kube-apiserver sends its own deadline as
// the timeout parameter, rounded up to a second; the webhook answers a second before
// it (half of it when it is 2 s or less), so that nothing is allocated after
// kube-apiserver gave up.
func (w *Webhook) budget(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	if err != nil || d <= 0 {
		return w.maxTime
	}
	if d > 2*time.Second {
		return min(d-time.Second, w.maxTime)
	}
	return min(d/2, w.maxTime)
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
