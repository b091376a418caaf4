package endpoints

import (
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file decides whether a stored object can go to a watcher as it is stored. The
// stored form of an Endpoints object and of a slice is the encoding of the API's
// message without its revisions (codec.go, slicecodec.go), so the server can send it
// as the message's bytes with the revisions appended, instead of decoding it,
// converting it and encoding it again, provided that what the watcher parses is what
// the conversion would have sent. That holds for a well-formed value with valid UTF-8
// strings (protobuf-go refuses to send others), whose slice endpoints all have
// conditions (the conversion always sends them), no optional string present but
// empty (the conversion leaves those out) and ports with their name, number and
// protocol (the conversion always sends them), no field the API's message does not
// know (a watcher would keep it, the decoding drops it) and no message field twice (a
// watcher merges the two, the decoding keeps the last): what allocd writes. Anything
// else goes the way of decode and conversion, errors included.

// errNotExact stops the walk of a value that is not sent as stored.
var errNotExact = errMalformed

// The schemas of the messages inside the stored ones, as the API's messages have them
// (codec.go's stringsSchema serves several of them for decoding; sending as stored needs
// each message's own).
var (
	mapEntrySchema  = schema{-1, bytesField, bytesField}
	referenceSchema = schema{-1, bytesField, bytesField, bytesField, bytesField}
	addressSchema   = schema{-1, bytesField, bytesField, bytesField, bytesField}
)

// exactFields is fields for a value sent as stored: a field that sc does not know, or one
// of the message fields in once seen a second time, makes it not exact.
func exactFields(b []byte, sc schema, once []protowire.Number,
	fn func(num protowire.Number, v []byte, n uint64) error) error {
	var seen uint64
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return errMalformed
		}
		if int(num) >= len(sc) || sc[num] < 0 {
			return errNotExact
		}
		if slices.Contains(once, num) {
			if seen&(1<<num) != 0 {
				return errNotExact
			}
			seen |= 1 << num
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return errMalformed
		}
		rest = rest[n+m:]
	}
	return fields(b, sc, fn)
}

// exactEndpoints reports whether a stored Endpoints object is sent to watchers as it is
// stored (see above).
func exactEndpoints(b []byte) bool {
	return exactFields(b, endpointsSchema, nil, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1, 2, 7, 8:
			return validUTF8(v)
		case 3, 4:
			return stringFields(v, mapEntrySchema)
		case 5:
			return exactFields(v, subsetSchema, nil, func(num protowire.Number, v []byte, _ uint64) error {
				if num == 3 {
					return exactFields(v, portSchema, nil, stringsBut(2))
				}
				return exactAddress(v)
			})
		}
		return nil
	}) == nil
}

func exactAddress(b []byte) error {
	return exactFields(b, addressSchema, []protowire.Number{4}, func(num protowire.Number, v []byte,
		_ uint64) error {
		if num == 4 {
			return stringFields(v, referenceSchema) // the target reference
		}
		return validUTF8(v)
	})
}

// exactSlice reports whether a stored slice is sent to watchers as it is stored (see
// above).
func exactSlice(b []byte) bool {
	return exactFields(b, sliceSchema, nil, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1, 2, 5, 6:
			return validUTF8(v)
		case 3, 4:
			return stringFields(v, mapEntrySchema)
		case 7:
			return exactSliceEndpoint(v)
		case 8:
			return exactSlicePort(v)
		}
		return nil
	}) == nil
}

// exactSlicePort: a port with its name, number and protocol present (the conversion
// sends them even when empty).
func exactSlicePort(b []byte) error {
	var seen [5]bool
	err := exactFields(b, portSchema, nil, func(num protowire.Number, v []byte, n uint64) error {
		seen[num] = true
		return stringsBut(2)(num, v, n)
	})
	if err == nil && !(seen[1] && seen[2] && seen[3]) {
		return errNotExact
	}
	return err
}

func exactSliceEndpoint(b []byte) error {
	conditions := false
	err := exactFields(b, sliceEndpointSchema, []protowire.Number{2, 6, 7}, func(num protowire.Number,
		v []byte, _ uint64) error {
		switch num {
		case 1:
			return validUTF8(v)
		case 2:
			conditions = true
			return exactFields(v, conditionsSchema, nil, func(protowire.Number, []byte, uint64) error {
				return nil
			})
		case 3, 4, 5:
			if len(v) == 0 {
				return errNotExact
			}
			return validUTF8(v)
		case 6:
			return stringFields(v, referenceSchema)
		case 7:
			return exactFields(v, hintsSchema, nil, func(_ protowire.Number, v []byte, _ uint64) error {
				return stringFields(v, nameSchema) // a ForZone or a ForNode
			})
		}
		return nil
	})
	if err == nil && !conditions {
		return errNotExact
	}
	return err
}

// stringFields checks a message of schema sc whose fields are all strings (a map entry,
// an object reference, a hint's zone or node).
func stringFields(b []byte, sc schema) error {
	return exactFields(b, sc, nil, func(_ protowire.Number, v []byte, _ uint64) error {
		return validUTF8(v)
	})
}

// stringsBut checks the fields of a message other than the varint one.
func stringsBut(varint protowire.Number) func(protowire.Number, []byte, uint64) error {
	return func(num protowire.Number, v []byte, _ uint64) error {
		if num == varint {
			return nil
		}
		return validUTF8(v)
	}
}

func validUTF8(v []byte) error {
	if !utf8.Valid(v) {
		return errNotExact
	}
	return nil
}
