package grpcidem

import (
	"errors"
	"fmt"

	"github.com/onceonly/idempotency"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The stored answer of a call is a google.rpc.Status: the error status the
// method returned, or OK with the response message as its one detail. An
// Any keeps the response's type name beside its bytes, so that a replay
// can rebuild the message without knowing the method.

// answerOf is what the first call's outcome stores; an error releases the
// key instead (a non-final status, or a response that is not a proto
// message and so cannot be replayed).
func answerOf(resp any, err error, storeError func(*status.Status) bool) (*spb.Status, error) {
	if err != nil {
		s := status.Convert(err)
		if !storeError(s) {
			return nil, err
		}
		return s.Proto(), nil
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpcidem: response %T is not a proto message", resp)
	}
	detail, err := anypb.New(msg)
	if err != nil {
		return nil, err
	}
	return &spb.Status{Code: int32(codes.OK), Details: []*anypb.Any{detail}}, nil
}

// replay turns a stored answer back into the method's result.
func replay(a *spb.Status) (any, error) {
	if codes.Code(a.GetCode()) != codes.OK {
		return nil, status.FromProto(a).Err()
	}
	if len(a.GetDetails()) != 1 {
		return nil, Status(idempotency.ErrUnreadableRecord).Err()
	}
	msg, err := a.GetDetails()[0].UnmarshalNew()
	if err != nil {
		// The type is unknown to this program (not linked in) or its
		// bytes no longer parse: another version stored it.
		return nil, Status(idempotency.ErrUnreadableRecord).Err()
	}
	return msg, nil
}

// answerCodec stores answers as protobuf instead of JSON.
type answerCodec struct{}

func (answerCodec) Marshal(v any) ([]byte, error) {
	a, ok := v.(*spb.Status)
	if !ok {
		return nil, fmt.Errorf("grpcidem: cannot store %T", v)
	}
	return proto.Marshal(a)
}

func (answerCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(**spb.Status)
	if !ok {
		return errors.New("grpcidem: answers are read into a *status.Status")
	}
	*p = new(spb.Status)
	return proto.Unmarshal(data, *p)
}
