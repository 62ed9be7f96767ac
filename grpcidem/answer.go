package grpcidem

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/onceonly/idempotency"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// The stored answer of a call is a google.rpc.Status: the error status the
// method returned, or OK with the response message as its one detail. An
// Any keeps the response's type name beside its bytes, so that a replay
// can rebuild the message without knowing the method.

// answerOf is what the first call's outcome stores; an error releases the
// key instead (a status the error policy does not keep). A response the
// method returned that cannot be stored is answered unstorable.
func answerOf(resp any, err error, storeError func(*status.Status) bool) (*spb.Status, error) {
	if err != nil {
		s := sentStatus(err)
		if !storeError(s) {
			return nil, err
		}
		return s.Proto(), nil
	}
	msg, ok := messageOf(resp)
	if !ok {
		return unstorable(fmt.Errorf("grpcidem: response %T is not a proto message", resp)), nil
	}
	seen.learn(msg)
	detail, err := anypb.New(msg)
	if err != nil {
		return unstorable(fmt.Errorf("grpcidem: the response does not marshal: %w", err)), nil
	}
	return &spb.Status{Code: int32(codes.OK), Details: []*anypb.Any{detail}}, nil
}

// unstorableCode marks the answer of a method that ran and returned a
// response that cannot be stored: not a proto message, or one that does
// not marshal (a string field that is not UTF-8). answerCodec refuses to
// encode such an answer, so that Do keeps the key as executed and not
// replayable, as it keeps an answer too large: the method ran, and
// releasing its key would let a retry run it again. It is no gRPC code.
const unstorableCode = -1

func unstorable(why error) *spb.Status {
	return &spb.Status{Code: unstorableCode, Message: why.Error()}
}

// sentStatus is the status grpc-go sends the caller for a method's error:
// the error's own status (wrapped ones too), else the code of a context
// error it wraps (a dependency's deadline is DEADLINE_EXCEEDED, not
// UNKNOWN), else UNKNOWN; the message is the error's text.
func sentStatus(err error) *status.Status {
	if s, ok := status.FromError(err); ok {
		return s
	}
	return status.FromContextError(err)
}

// replay turns a stored answer back into the method's result.
func replay(a *spb.Status) (any, error) {
	if codes.Code(a.GetCode()) != codes.OK {
		return nil, status.FromProto(a).Err()
	}
	if len(a.GetDetails()) != 1 {
		return nil, Status(idempotency.ErrUnreadableRecord).Err()
	}
	msg, err := anypb.UnmarshalNew(a.GetDetails()[0], proto.UnmarshalOptions{Resolver: seen})
	if err != nil {
		// The type is unknown to this program (not linked in) or its
		// bytes no longer parse: another version stored it.
		return nil, Status(idempotency.ErrUnreadableRecord).Err()
	}
	// A message of the older API comes back as the method returned it
	// (its own type), not as the newer API's view of it.
	return protoadapt.MessageV1Of(msg), nil
}

// seen resolves the type of a stored response: from the registry of the
// protobuf API, and else from the responses this process's interceptors
// stored. A message of the older API is in that registry only when its
// generated code registered it there (github.com/golang/protobuf's does;
// gogo's registers in a registry of its own, and a hand-written message in
// none), and its type name is derived from its Go type otherwise: without
// the second source, such a response could be stored but never replayed.
var seen = &seenTypes{Types: protoregistry.GlobalTypes}

// seenTypes resolves extensions as the registry does.
type seenTypes struct {
	*protoregistry.Types
	types sync.Map // protoreflect.FullName → protoreflect.MessageType
}

func (s *seenTypes) learn(m proto.Message) {
	t := m.ProtoReflect().Type()
	s.types.LoadOrStore(t.Descriptor().FullName(), t)
}

func (s *seenTypes) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	if t, err := s.Types.FindMessageByName(name); err == nil {
		return t, nil
	}
	if t, ok := s.types.Load(name); ok {
		return t.(protoreflect.MessageType), nil
	}
	return nil, protoregistry.NotFound
}

func (s *seenTypes) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	name := url
	if i := strings.LastIndexByte(url, '/'); i >= 0 {
		name = url[i+1:]
	}
	return s.FindMessageByName(protoreflect.FullName(name))
}

// messageOf is v as a message of the protobuf API this package speaks
// (google.golang.org/protobuf), also when v was generated for the older
// one (github.com/golang/protobuf's protoc-gen-go, gogo): grpc-go serves
// both, and so must the interceptor.
func messageOf(v any) (proto.Message, bool) {
	switch m := v.(type) {
	case proto.Message:
		return m, true
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(m), true
	}
	return nil, false
}

// answerCodec stores answers as protobuf instead of JSON. It is also the
// codec of the steps a method journals (idempotency.Step, under
// idempotency.WithResume), whose results are the method's own values: a
// protobuf message (another service's answer) is stored as protobuf, and
// anything else as JSON, as a step of an HTTP handler is; a step's
// Permanent error that is a gRPC status is journaled whole.
type answerCodec struct{}

func (answerCodec) Marshal(v any) ([]byte, error) {
	if s, ok := v.(*spb.Status); ok && s.GetCode() == unstorableCode {
		return nil, errors.New(s.GetMessage())
	}
	if m, ok := v.(proto.Message); ok {
		return proto.Marshal(m)
	}
	return idempotency.JSON.Marshal(v)
}

func (answerCodec) Unmarshal(data []byte, v any) error {
	if p, ok := v.(**spb.Status); ok {
		*p = new(spb.Status)
		return proto.Unmarshal(data, *p)
	}
	// A step's result: v points at a T, a message's pointer type or not.
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		if t := rv.Type().Elem(); t.Kind() == reflect.Pointer && t.Implements(messageType) {
			m := reflect.New(t.Elem())
			if err := proto.Unmarshal(data, m.Interface().(proto.Message)); err != nil {
				return err
			}
			rv.Elem().Set(m)
			return nil
		}
	}
	return idempotency.JSON.Unmarshal(data, v)
}

// MarshalError carries a step's Permanent error whole when it is a gRPC
// status (idempotency.ErrorCodec): a resumed run gets the status back,
// and its caller the code the first run's caller got, not UNKNOWN.
func (answerCodec) MarshalError(err error) ([]byte, bool) {
	s, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	b, err := proto.Marshal(s.Proto())
	return b, err == nil
}

// UnmarshalError gives back the status MarshalError encoded.
func (answerCodec) UnmarshalError(data []byte) (error, error) {
	p := new(spb.Status)
	if err := proto.Unmarshal(data, p); err != nil {
		return nil, err
	}
	return status.FromProto(p).Err(), nil
}

var messageType = reflect.TypeFor[proto.Message]()
