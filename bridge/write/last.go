package write

import (
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// lastWritten keeps the object a writer wrote last for each key, until the informer
// has caught up with it: a sync that follows its own write at once then compares with
// what it wrote instead of with an older cached state (and does not write again).
type lastWritten[T ClusterObject] struct {
	mu   sync.Mutex
	objs map[string]T
}

func newLastWritten[T ClusterObject]() *lastWritten[T] {
	return &lastWritten[T]{objs: map[string]T{}}
}

func (l *lastWritten[T]) put(key string, obj T) {
	l.mu.Lock()
	l.objs[key] = obj
	l.mu.Unlock()
}

func (l *lastWritten[T]) forget(key string) {
	l.mu.Lock()
	delete(l.objs, key)
	l.mu.Unlock()
}

// newer returns the newer of cached (the informer's, possibly absent: the zero T) and
// the last written, by resourceVersion; the last written is dropped once the informer
// has it.
func (l *lastWritten[T]) newer(key string, cached T) T {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, ok := l.objs[key]
	if !ok {
		return cached
	}
	var none T
	if cached == none || rv(last) > rv(cached) {
		return last
	}
	delete(l.objs, key)
	return cached
}

func rv(o metav1.Object) int64 {
	n, _ := strconv.ParseInt(o.GetResourceVersion(), 10, 64)
	return n
}

// dropManagedFields keeps the informers' caches small: nothing here reads them.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
