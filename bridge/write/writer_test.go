package write

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRegisterAfterStart: a Writer registered after its kind's informer started fails
// (the informer's transform can no longer be set) rather than going on without it.
func TestRegisterAfterStart(t *testing.T) {
	kube := fake.NewClientset()
	f := informers.NewSharedInformerFactory(kube, 0)
	w := New(slog.New(slog.NewTextHandler(io.Discard, nil)), NewEndpoints(nil, kube, f, nil, false), 1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	defer func() {
		cancel()
		f.Shutdown()
	}()
	if err := w.Register(); err == nil {
		t.Error("Register() after the informer started = nil; want the transform's error")
	}
}
