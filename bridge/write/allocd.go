package write

import (
	"context"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// This file reads allocd's side of a kind: its listing and its watch.

// listAll reads every page of one of allocd's listings (list reads the page of *token,
// items its objects), read at the first page's revision, into a map by namespace/name
// of the objects keep keeps; it returns the revision.
func listAll[R interface {
	GetRevision() int64
	GetNextPageToken() string
}, T Object](ctx context.Context, token *string, list func(context.Context) (R, error), items func(R) []T,
	keep func(obj T) bool) (map[string]T, int64, error) {
	out := map[string]T{}
	var rev int64
	for {
		resp, err := list(ctx)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.GetRevision()
		}
		for _, o := range items(resp) {
			if keep(o) {
				out[o.GetNamespace()+"/"+o.GetName()] = o
			}
		}
		if *token = resp.GetNextPageToken(); *token == "" {
			return out, rev, nil
		}
	}
}

// eachChange is the function a watch of allocd's objects of one kind calls with each
// change r: it hands fn the key of its object (obj gets it from r), the object (nil
// when allocd deleted it) and the revision of the change, for the objects keep keeps.
func eachChange[R interface {
	GetType() allocdv1.WatchEventType
	GetRevision() int64
}, T Object](obj func(R) T, keep func(T) bool, fn func(key string, obj T, rev int64)) func(R) error {
	return func(r R) error {
		o := obj(r)
		if !keep(o) {
			return nil
		}
		key := o.GetNamespace() + "/" + o.GetName()
		if r.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
			var none T
			o = none
		}
		fn(key, o, r.GetRevision())
		return nil
	}
}
