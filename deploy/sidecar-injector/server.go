package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxReview bounds an AdmissionReview's body: the API server sends at
// most a few MiB of object.
const maxReview = 8 << 20

// webhook answers the API server's AdmissionReviews for pods.
type webhook struct {
	// cfg is the injector's config of the moment: it is read again when
	// its file changes.
	cfg func() Config
	log *slog.Logger
	// newToken makes a pod's drain token; rand.Text outside tests.
	newToken func() string
}

func (w *webhook) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", w.mutate)
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok\n") })
	return mux
}

func (w *webhook) mutate(rw http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		http.Error(rw, "want Content-Type application/json, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxReview))
	if err != nil {
		http.Error(rw, "read review: "+err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, fmt.Sprintf("not an AdmissionReview request: %v", err), http.StatusBadRequest)
		return
	}
	resp := w.review(review.Request)
	resp.UID = review.Request.UID
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(out)
}

// review decides one request: allowed with a patch, allowed as it is, or
// denied with the annotation to fix.
func (w *webhook) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	log := w.log.With("uid", req.UID, "namespace", req.Namespace, "name", req.Name)
	if req.Kind.Kind != "Pod" || req.Kind.Group != "" {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		log.Error("pod unreadable", "err", err)
		return deny(http.StatusBadRequest, "handoff sidecar injector: the pod could not be read: "+err.Error())
	}
	// The API server names a pod of a controller only after admission, and
	// only while its name is empty: the name is never written here, the
	// log says generateName instead.
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	patch, err := patchFor(req.Object.Raw, &pod, w.cfg(), w.newToken)
	if err != nil {
		log.Info("pod denied", "pod", name, "err", err)
		return deny(http.StatusUnprocessableEntity, err.Error())
	}
	if len(patch) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	log.Info("sidecar injected", "pod", name, "operations", len(patch))
	raw, err := json.Marshal(patch)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: raw, PatchType: &pt}
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: msg}}
}
