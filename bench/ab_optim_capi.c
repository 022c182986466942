/* Before/after of the optimizer's C kernels in one process: dlopen two builds
 * of libmixprec_capi.so (RTLD_LOCAL: each its own copy) and time
 * mixprec_adamw_step alternately (A B, B A, ...) on identical, separately
 * allocated BF16 tensors of one mode; prints both medians and the median of
 * the per-round ratios. Used for the lean-state kernel changes of issue 24
 * (bench/results/optim_lean_cpu.md), where the machine's drift between two
 * runs is larger than the change.
 *
 *   gcc -O2 -Ic_ops/include bench/ab_optim_capi.c -ldl -o /tmp/ab
 *   /tmp/ab OLD/libmixprec_capi.so NEW/libmixprec_capi.so MODE NUMEL NTENSORS ROUNDS
 *
 * MODE: master (BF16 + FP32 master), sr (master-free), rem (remainders),
 * rembf / srbf (+ BF16 moments), rem8 / sr8 (+ 8-bit moments). Threads: the
 * library's (OMP_NUM_THREADS). */
#define _GNU_SOURCE
#include <mixprec/optim.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef mixprec_status (*step_fn)(const mixprec_opt_tensor*, int64_t, const mixprec_adamw_params*);
typedef mixprec_adamw_params (*def_fn)(void);
static uint16_t bf(float f){uint32_t u;memcpy(&u,&f,4);return (uint16_t)((u+0x7fff+((u>>16)&1))>>16);}
static float frand(uint64_t *s){*s=*s*6364136223846793005ull+1442695040888963407ull;return ((double)(*s>>40)/(1<<24))*2-1;}
static void mk(mixprec_opt_tensor*t,const char*mode,int64_t n,uint64_t seed){
  uint64_t s=seed; uint16_t*p=malloc(n*2),*g=malloc(n*2); int16_t*rem=calloc(n,2);
  float*M=malloc(n*4),*m=calloc(n,4),*v=calloc(n,4); uint8_t*c0=calloc(n+64,1),*c1=calloc(n+64,1);
  uint16_t*bm=calloc(n,2),*bv=calloc(n,2); float*s0=calloc(n/256+2,4),*s1=calloc(n/256+2,4); float*st=calloc(1,4);
  for(int64_t i=0;i<n;i++){M[i]=frand(&s);p[i]=bf(M[i]);g[i]=bf(frand(&s)*1e-2f);}
  memset(t,0,sizeof *t); t->param=p;t->grad=g;t->numel=n;t->param_dtype=MIXPREC_BF16;t->grad_dtype=MIXPREC_BF16;t->step=st;
  t->exp_avg=m;t->exp_avg_sq=v;
  int pm_master=!strcmp(mode,"master"), pm_rem=!strncmp(mode,"rem",3);
  if(pm_master) t->master=M; if(pm_rem) t->remainder=rem;
  const char*mo=mode+(pm_rem?3:(strncmp(mode,"sr",2)?0:2));
  if(!strcmp(mo,"bf")){t->exp_avg_data=bm;t->exp_avg_sq_data=bv;t->exp_avg_dtype=t->exp_avg_sq_dtype=MIXPREC_STATE_BF16;}
  if(!strcmp(mo,"8")){t->exp_avg_data=c0;t->exp_avg_sq_data=c1;t->exp_avg_dtype=t->exp_avg_sq_dtype=MIXPREC_STATE_Q8;t->exp_avg_scale=s0;t->exp_avg_sq_scale=s1;}
}
static double now(void){struct timespec a;clock_gettime(CLOCK_MONOTONIC,&a);return a.tv_sec+a.tv_nsec*1e-9;}
static int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  const char*mode=argv[3]; int64_t n=atoll(argv[4]); int nt=atoi(argv[5]); int R=atoi(argv[6]);
  step_fn f[2]; mixprec_adamw_params hp[2];
  for(int k=0;k<2;k++){void*h=dlopen(argv[1+k],RTLD_NOW|RTLD_LOCAL); if(!h){fprintf(stderr,"%s\n",dlerror());return 1;}
    f[k]=(step_fn)dlsym(h,"mixprec_adamw_step"); hp[k]=((def_fn)dlsym(h,"mixprec_adamw_params_default"))();}
  mixprec_opt_tensor *L[2]; for(int k=0;k<2;k++){L[k]=malloc(sizeof(mixprec_opt_tensor)*nt); for(int j=0;j<nt;j++) mk(&L[k][j],mode,n,1+j);}
  for(int w=0;w<2;w++) for(int k=0;k<2;k++) f[k](L[k],nt,&hp[k]);
  double *t[2]={malloc(R*8),malloc(R*8)}, *ratio=malloc(R*8);
  for(int r=0;r<R;r++){ for(int kk=0;kk<2;kk++){int k=(r&1)?1-kk:kk; double a=now(); f[k](L[k],nt,&hp[k]); t[k][r]=now()-a;} ratio[r]=t[0][r]/t[1][r]; }
  qsort(t[0],R,8,cmpd);qsort(t[1],R,8,cmpd);qsort(ratio,R,8,cmpd);
  printf("%-7s %d x %lld: before %.2f ms, after %.2f ms (medians of %d), speed-up %.3fx (median of per-round ratios)\n",mode,nt,(long long)n,t[0][R/2]*1e3,t[1][R/2]*1e3,R,ratio[R/2]);
  return 0;}
